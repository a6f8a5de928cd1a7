"""Monitor hosts (group ``monitor``, no hardware group): Prometheus and alertmanager from Debian,
scraping every host of the inventory; they serve no model. docs/monitoring.md.

The SLO thresholds here shape the alert rules the monitor evaluates; the watchdog keys apply on
serving hosts (set them in group_data/all.py or a hardware group).
"""

monitor_retention = "15d"                            # how long samples are kept
monitor_storage_path = "/var/lib/prometheus/metrics2"
monitor_scrape_interval_s = 15

slo_ttft_p95_s = 2.0         # time to first token p95 (s) above it for 10 min: alert
slo_e2e_p95_s = 60.0         # request latency p95 (s) above it for 10 min: alert
slo_error_ratio = 0.01       # 5xx share above it for 5 min: alert
