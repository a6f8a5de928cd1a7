"""The fleet gateway's hosts (docs/gateway.md): smg behind nginx, no GPU, no engine.

A host in this group and in no hardware group serves no model. The clients' keys are the
inventory's `api_keys_file` (checked here, once); `proxy_tls_cert_file`/`proxy_tls_key_file` are
the gateway's certificate too. Every key: docs/configuration.md, "Gateway".
"""

gateway_policy = "cache_aware"       # a conversation's prefix stays on the host that caches it
gateway_balance_abs_threshold = 4    # issue 14: stickiness 100% over 10 prefixes (smg's own: 72%)
gateway_balance_rel_threshold = 1.2
gateway_health_interval_s = 5        # a dead engine leaves the rotation within about this
gateway_health_failures = 1          # failed checks in a row before a worker is ejected
gateway_port = 9443                  # the clients' TLS front
