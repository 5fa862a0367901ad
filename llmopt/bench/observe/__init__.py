"""The observe wing: what the bench reads of the server and the machine beside the load. Its face:
`server_metrics` (MetricsSampler), `server_stats` (/metrics counters), `metric_names` (each engine's
names for one set of figures), `machine_meter` (CPU seconds and joules, from `process_cpu` and `rapl`,
and `memory_bandwidth`) and `prefix_cache` (its reset between points). It imports no other wing."""
