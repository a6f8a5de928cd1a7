"""Token metering per key (issue 29), rendered on the control node (pure: no host access).

The proxy writes one line per answered prompt request into proxy_conf.USAGE_LOG: the deployment,
the key's id and its tenant (never the key), the status and the token counts the engine returned
in its ``usage`` (proxy_conf.METER_JS_TEXT reads them from the answer). mtail (Debian's package,
a log-to-Prometheus exporter) reads that log on each host with a proxy or a gateway and counts:

- ``gpuserve_tokens_total{deployment, key_id, tenant, kind}``: kind "prompt" or "completion",
  the sums of the engine's own counts;
- ``gpuserve_metered_requests_total{deployment, key_id, tenant}``: the requests counted there;
- ``gpuserve_unmetered_requests_total{deployment, key_id, tenant}``: answers with status 200 but
  no usage (a stream whose client did not ask for usage, on an engine without
  ``enable-force-include-usage``; a stream the client dropped before its end): tokens the
  engine spent that no key is charged with.

``tenant`` is the tenant of a tenant's key (``c-<tenant>-<n>``, gpuserve.tenants) and "-" for every
other key. mtail listens on loopback only (PORT); the monitor scrapes it through the exporters'
TLS front on NODE_EXPORTER_TLS_PORT under METRICS_PATH (gpuserve.monitoring). Its counters live
in mtail's memory: a restart starts them at 0 (Prometheus's rate() and increase() take resets),
and lines written while mtail is down are not counted.
"""

from __future__ import annotations

from gpuserve import layout, proxy_conf, templating

PACKAGE = "mtail"
UNIT = "gpuserve-meter.service"
DEBIAN_UNIT = "mtail.service"          # Debian's own: left stopped and disabled
PORT = 3903                            # mtail's default, on 127.0.0.1 only
PROGRAM_DIR = layout.METER_PROGRAM_DIR
PROGRAM = f"{PROGRAM_DIR}/tokens.mtail"
METRICS_PATH = "/meter/metrics"        # on the exporters' TLS front

TOKENS = "gpuserve_tokens_total"
METERED = "gpuserve_metered_requests_total"
UNMETERED = "gpuserve_unmetered_requests_total"
LABELS = ("deployment", "key_id", "tenant")

# one line of log_format gpuserve_usage (templates/nginx-common.conf.j2); a line with counts
# adds them, a 200 without them is unmetered, anything else (an error the engine answered) is
# left alone
PROGRAM_TEXT = f"""\
# Managed by gpuserve (pyinfra): tokens per key from the proxy's usage log (gpuserve/meter.py)
counter {TOKENS} by deployment, key_id, tenant, kind
counter {METERED} by deployment, key_id, tenant
counter {UNMETERED} by deployment, key_id, tenant

/^\\S+ deployment=(?P<deployment>[a-z0-9_-]+) key=(?P<key_id>[a-z0-9-]+) tenant=(?P<tenant>[a-z0-9-]+) status=(?P<status>\\d+) / {{
  /prompt=(?P<prompt>\\d+) completion=(?P<completion>\\d+)$/ {{
    {TOKENS}[$deployment][$key_id][$tenant]["prompt"] += $prompt
    {TOKENS}[$deployment][$key_id][$tenant]["completion"] += $completion
    {METERED}[$deployment][$key_id][$tenant]++
  }} else {{
    $status == 200 {{
      {UNMETERED}[$deployment][$key_id][$tenant]++
    }}
  }}
}}
"""


def unit_text() -> str:
    """gpuserve-meter.service (templates/gpuserve-meter.service.j2): mtail as Debian's ``mtail``
    user, in group adm (nginx's logs are www-data:adm 0640), on loopback only, confined."""
    return templating.render("gpuserve-meter.service.j2", progs=PROGRAM_DIR, log=proxy_conf.USAGE_LOG,
                             port=PORT)
