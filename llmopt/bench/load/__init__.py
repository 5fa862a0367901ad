"""The load wing: sends a load point's requests and times each one. Its face: `client` (Target, send;
what it records is bench/schema.py's RequestRecord), `load_point` (LoadPoint, PointResult, Run,
Measured), `runner` (run_point, run_sessions), and `saturation` / `stop_on_saturation` (a point whose
load outruns the server).
It reads workloads (workload/) and the observers' meters (observe/); it never imports the sweep."""
