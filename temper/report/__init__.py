"""Run reports: a PNG dashboard and a markdown summary from a run's ``metrics.jsonl``."""

from temper.report.dashboard import (
    PANELS,
    Report,
    plot_dashboard,
    read_metrics,
    summary_markdown,
    write_report,
)

__all__ = ["PANELS", "Report", "plot_dashboard", "read_metrics", "summary_markdown", "write_report"]
