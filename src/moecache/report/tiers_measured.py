"""The tiers measured in the harness (results/tiers/harness/<device>.json, issue 40 point 3)
for the report: one row per arm (the all-resident reference, then each admission) with its
counts, measured ms/token and interval, and equation (1) with a term per tier beside it;
and the sentences that state the check. It reads the file as its record
(records/tiers_measured.py)."""

from __future__ import annotations

import pandas as pd

from moecache.costs.tier_equation import TIER_WITHIN
from moecache.records.io import read_record
from moecache.records.tiers_measured import TiersMeasuredResult

CAPTION = (
    "The tiers decoded for real (moecache tiers-harness, harness.tiers): the restricted "
    "layers' experts read from a safetensors file on disk past the page cache into a host "
    "cache of H experts per layer under C device slots, a bypassed miss computed on the host; "
    "the all-resident reference and one arm per admission decoded interleaved. Predicted: "
    "equation (1) with a term per tier, c + deciding + (copies x copy + reads x disk read + "
    "computes x (host - device matvec)) / tokens, at the event prices the decode timed; and "
    "at the prices measured apart from any decode."
)


def read(path) -> TiersMeasuredResult:
    return read_record(path, TiersMeasuredResult)


def frame(result: TiersMeasuredResult) -> pd.DataFrame:
    rows = [
        {
            "arm": "all resident",
            "ms_per_token": result.resident["ms_per_token"],
            "ci_low": result.resident["ms_per_token_ci"][0],
            "ci_high": result.resident["ms_per_token_ci"][1],
        }
    ]
    for admission, arm in result.admissions.items():
        rows.append(
            {
                "arm": admission,
                "copies": arm["copies"],
                "reads": arm["reads"],
                "computes": arm["computes"],
                "ms_per_token": arm["ms_per_token"],
                "ci_low": arm["ms_per_token_ci"][0],
                "ci_high": arm["ms_per_token_ci"][1],
                "predicted": arm["predicted_ms_per_token"],
                "ratio": arm["ratio"],
                "predicted_prices_apart": arm["predicted_from_prices_apart_ms_per_token"],
                "ratio_prices_apart": arm["ratio_from_prices_apart"],
            }
        )
    return pd.DataFrame(rows)


def within(ratio: float) -> bool:
    return abs(ratio - 1.0) <= TIER_WITHIN


def lines(result: TiersMeasuredResult) -> list[str]:
    """The check in sentences: the prices measured, then per admission the prediction
    against the measured ms/token."""
    price = {event: p["ms"] for event, p in result.prices.items()}
    host = "no disk" if result.host is None else f"H = {result.host}"
    out = [
        f"Measured in the harness (C = {result.capacity}, {host}, {result.rule} over "
        f"{result.host_rule}, {result.sequences} sequences x {result.tokens // result.sequences} "
        f"tokens, {result.repeats} repeats; disk reads by {result.disk_read}): a disk read "
        f"{price['disk_to_host_ms']:.3f} ms, a copy {price['host_to_device_ms']:.3f} ms, a host "
        f"matvec {price['host_compute_ms']:.3f} ms per expert."
    ]
    for admission, arm in result.admissions.items():
        ok = within(arm["ratio"]) and within(arm["ratio_from_prices_apart"])
        out.append(
            f"Admission {admission}: measured {arm['ms_per_token']:.2f} ms/token, equation (1) "
            f"with a term per tier predicts {arm['predicted_ms_per_token']:.2f} (ratio "
            f"{arm['ratio']:.3f}; at the prices measured apart "
            f"{arm['ratio_from_prices_apart']:.3f}): "
            f"{'within' if ok else 'not within'} {TIER_WITHIN:.0%}."
        )
    if result.shared_processor:
        out.append(
            "On this CPU the device and the host share the processor, so a host compute and "
            "a device matvec cost alike here."
        )
    return out + gpu_lines(result.gpu_check)


def gpu_lines(check: dict) -> list[str]:
    """The device side priced by the committed GPU check, where one is."""
    if not check.get("committed"):
        return [f"The device side is not priced by a GPU: {check.get('note', 'no check')}."]
    return [
        f"Priced by the committed GPU check ({check['device_name']}: a copy of its expert "
        f"{check['tau_ms']:.3f} ms), this host's matvec of that expert "
        f"({check['host_compute_ms_scaled']:.2f} ms, scaled by bytes) costs "
        f"{check['host_compute_to_copy']:.1f} copies: the ratio to set against the "
        "break-even ratios above."
    ]
