"""The router actor (``actor``): one request's flow under the router's limits (``flow``), the
OpenAI-compatible front door (``ingress``) and the Prometheus exporter (``exporter``)."""
