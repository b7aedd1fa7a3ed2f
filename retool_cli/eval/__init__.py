"""Evaluation: resumable sampling of benchmark problems and their summary (sampling.py), the estimators
(metrics.py: pass@k, avg@k with standard errors, maj@k) and reports over runs and seeds (report.py)."""
