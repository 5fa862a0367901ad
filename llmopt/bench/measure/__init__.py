"""The measure wing: a point's figures from what the load wing recorded. Its face: `request_metrics`
(summarize, summarize_results, meets_slo), `session_metrics`, `steady_state` and `token_cost`. It reads
the load wing's records and the observers' readings; it never imports the sweep."""
