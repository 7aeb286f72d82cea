"""Diagnosis: what the metrics mean for the run — the verdict, the ranked findings with their
evidence and recommendations, the straggler, and the comparison with a baseline run.

It reads the query results pipeline/analyze.py gathers (queries/*.sql through pipeline/query.py)
and returns plain dicts; it renders nothing (pipeline/report/ turns them into HTML, Markdown and
JSON) and never reads the lake's files itself.
- verdict.py: network-, straggler-, compute-, copy-, host- or input-bound, or balanced, with
  confidence, numbers and caveats (rules and sources: docs/report.md);
- straggler.py: who made the others wait, and why (late start, longer compute, data loading);
- findings.py: one finding per disjoint part of the step time, ranked by the time it could win;
- nccl_findings.py: findings from NCCL logs (watchdog timeouts, COLL mismatches, transports);
- compare.py: which step-time components and kernels moved against a baseline run.
"""
