"""The memory chart's data (pure): per GPU, memory over time split into each job's share of
"ours", foreign and free, with the OOMs on that card, as the arrays uPlot draws.

A card that ran many jobs keeps its `max_jobs` largest as their own bands and sums the rest
into one band named for how many jobs it holds, so nothing is dropped from the total."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.store.gpu_samples import GpuSample
from orchestrator.store.web_queries import OomMark
from orchestrator.web.colours import job_colours

JOB_PALETTE = ("#3b7dd8", "#2e9d5b", "#8e6bd8", "#1fa2a8", "#5c7cfa", "#4f9d2e", "#b05fc4", "#2b8cbe",
               "#6aa84f", "#7d8fd8", "#38a3a5", "#9b59b6")
UNSPLIT_COLOUR = "#6b93d6"  # ours, where the sample did not record each job's share
FOREIGN_COLOUR = "#e0a030"
FREE_COLOUR = "#e6e6e6"
MAX_POINTS = 600


@dataclass(frozen=True)
class Band:
    label: str
    colour: str
    mib: list[int]
    job_id: int | None = None


@dataclass(frozen=True)
class GpuMemoryChart:
    gpu: int
    total_mib: int
    ts: list[float]
    bands: list[Band]  # bottom to top: jobs, ours unsplit, foreign, free
    ooms: list[OomMark]

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "total_mib": self.total_mib,
            "ts": self.ts,
            "bands": [
                {"label": b.label, "colour": b.colour, "mib": b.mib, "job": b.job_id}
                for b in self.bands
            ],
            "ooms": [
                {
                    "ts": o.ts,
                    "job": o.job_id,
                    "attempt": o.attempt,
                    "label": f"OOM: job {o.job_id} attempt {o.attempt} · {o.config}",
                }
                for o in self.ooms
            ],
        }


def thin(samples: Sequence[GpuSample], limit: int) -> list[GpuSample]:
    """Every k-th sample and the last, at most about `limit`."""
    if len(samples) <= limit:
        return list(samples)
    stride = -(-len(samples) // limit)
    return list(samples[::stride]) + ([samples[-1]] if (len(samples) - 1) % stride else [])


def memory_charts(
    samples: Sequence[GpuSample], ooms: Sequence[OomMark], labels: Mapping[int, str], *,
    max_jobs: int = 12, max_points: int = MAX_POINTS, configs: Mapping[int, str] | None = None,
) -> list[GpuMemoryChart]:
    """`configs` (job id -> config): each job's band takes its config's hue and a shade for its
    seed, the same on every card (orchestrator.web.colours); without, a palette by position."""
    colour_of = job_colours(configs) if configs else {}
    by_gpu: dict[int, list[GpuSample]] = {}
    for s in samples:
        by_gpu.setdefault(s.gpu_index, []).append(s)
    charts = []
    for gpu, series in sorted(by_gpu.items()):
        series = thin(series, max_points)
        peak: dict[int, int] = {}
        for s in series:
            for job_id, held in s.held_by_job.items():
                peak[job_id] = max(peak.get(job_id, 0), held)
        own = sorted(peak, key=lambda j: (-peak[j], j))[:max_jobs]
        rest = sorted(set(peak) - set(own))
        bands = [Band(labels.get(j, f"job {j}"), colour_of.get(j, JOB_PALETTE[i % len(JOB_PALETTE)]),
                      [s.held_by_job.get(j, 0) for s in series], j)
                 for i, j in enumerate(sorted(own))]
        if rest:
            bands.append(Band(f"{len(rest)} other jobs", "#9fb3d1", [
                sum(s.held_by_job.values()) - sum(s.held_by_job.get(j, 0) for j in own) for s in series]))
        # ours minus what the jobs' shares account for (old samples, or a share not recorded)
        unsplit = [max(0, s.orch_mib - sum(s.held_by_job.values())) for s in series]
        if any(unsplit):
            bands.append(Band("ours (not split by job)", UNSPLIT_COLOUR, unsplit))
        bands.append(Band("foreign", FOREIGN_COLOUR, [s.foreign_mib for s in series]))
        bands.append(Band("free", FREE_COLOUR, [max(0, s.total_mib - max(s.used_mib, s.orch_mib)) for s in series]))
        t0 = series[0].ts
        charts.append(GpuMemoryChart(gpu, max(s.total_mib for s in series), [s.ts for s in series], bands,
                                     [o for o in ooms if o.gpu == gpu and o.ts >= t0]))
    return charts
