"""`ccbench diagnose`: which host's link, pair's path, uplink, plane port or host's compute
of a cluster is out of line. plan.py (what to measure), measure.py (every rank), analyse.py
(measurements -> findings), verdict.py (the table and JSON)."""
