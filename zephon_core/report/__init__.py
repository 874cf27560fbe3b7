"""A run as figures: ``load`` reads it from checkpoints or audit logs (``inputs``) with what its recipe
adds, taking plain values (``ReportRequest``); ``history`` is the run as data, ``figures`` and
``plan_figures`` the numbers to print and draw, ``plots`` draws them, ``text`` prints them."""

from zephon_core.report.load import ReportRequest, load_run

__all__ = ["ReportRequest", "load_run"]
