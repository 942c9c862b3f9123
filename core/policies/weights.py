"""Weights of the unified score and of the risk price (from the experiment spec)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Weights(BaseModel):
    """S_j = load_j + lambda_f * health_j + lambda_r * pi_j + lambda_p * path_j and
    pi_j = alpha * util_j + beta * (1 - bw_j / bw0_j) + gamma * timeout_rate_j + eta * failure_rate_j.

    Load and every price component are utilisations or rates in [0, 1], so a weight
    of 1 makes a fully risky pod cost as much as a fully loaded worker.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    lambda_f: float = Field(1.0, ge=0, description="soft health penalty (the mask is a filter)")
    lambda_r: float = Field(1.0, ge=0, description="risk price")
    # 0 so no variant gains from co-locating prefill and decode in the default scenarios;
    # raise it to study locality.
    lambda_p: float = Field(0.0, ge=0, description="path cost (0 inside a pod, 1 across the core)")
    alpha: float = Field(0.25, ge=0, description="utilisation")
    beta: float = Field(1.0, ge=0, description="missing bandwidth 1 - bw/bw0")
    gamma: float = Field(1.0, ge=0, description="timeout rate")
    eta: float = Field(1.0, ge=0, description="non-timeout failure rate")
