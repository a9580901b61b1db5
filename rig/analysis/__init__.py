"""Offline analysis of run directories: metrics, tables, plots, comparisons (``rig report``, ``rig compare``)."""

from rig.analysis.report import Report, build_report
from rig.analysis.tables import CAMPAIGN_KEYS, campaign_table, render_campaign_table

__all__ = ["CAMPAIGN_KEYS", "Report", "build_report", "campaign_table", "render_campaign_table"]
