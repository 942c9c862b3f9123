"""A run directory packed by the router and unpacked where the driver runs (testbed/router/run_archive.py)."""

from __future__ import annotations

import io
import tarfile

import pytest

from testbed.router.run_archive import pack_dir, unpack_dir

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)


def test_a_run_directory_comes_back_whole(tmp_path):
    run = tmp_path / "router-node" / "spec" / "LC" / "seed-0"
    (run / "sub").mkdir(parents=True)
    (run / "requests.parquet").write_bytes(bytes(range(256)) * 40)
    (run / "run.json").write_text('{"status": "finished"}')
    (run / "sub" / "host.tsv").write_text("1\t2\n")
    dest = tmp_path / "driver-node" / "spec" / "LC"
    names = unpack_dir(pack_dir(run), dest)
    assert sorted(names) == ["seed-0", "seed-0/requests.parquet", "seed-0/run.json", "seed-0/sub", "seed-0/sub/host.tsv"]
    for f in ("requests.parquet", "run.json", "sub/host.tsv"):
        assert (dest / "seed-0" / f).read_bytes() == (run / f).read_bytes()
    # unpacked again over itself (one node, or a shared filesystem): the same files
    unpack_dir(pack_dir(run), run.parent)
    assert (run / "run.json").read_text() == '{"status": "finished"}'


def test_an_archive_reaching_outside_its_folder_is_refused(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("../outside.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    with pytest.raises(tarfile.FilterError):
        unpack_dir(buf.getvalue(), tmp_path / "in")
    assert not (tmp_path / "outside.txt").exists()
