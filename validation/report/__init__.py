"""``shard-report``'s parts: reading jobs, figures they did not record, search curves, plots."""

from __future__ import annotations

from validation.report.curves import Curve, read_curve
from validation.report.figures import fill_megatron, fill_sim, megatron_figure, sim_figure
from validation.report.jobs import CSV_COLUMNS, Job, collect, find_jobs, read_job
from validation.report.plots import curves_plot, throughput_plot

__all__ = ["CSV_COLUMNS", "Curve", "Job", "collect", "curves_plot", "fill_megatron", "fill_sim", "find_jobs",
           "megatron_figure", "read_curve", "read_job", "sim_figure", "throughput_plot"]
