"""The study: a spec's grid (its cells: study/grid.py expands them) run in the simulator as Ray
tasks, resumably (``runner``; each cell in a child interpreter, ``clean_process``), and on the
testbed (``testbed_side``), each finished run marked by the one ``cell.json`` writer (``cells``).
It imports both worlds and the analysis (a cell's metrics are computed where it ran); the command
line (cli/study.py) parses and calls it. The report reads what it wrote: study/table.py."""
