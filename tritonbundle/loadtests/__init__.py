"""Locust load tests: users for HTTP and gRPC, traffic-shaped requests, load shapes, SLO gates,
reports with plots and Triton's server-side view. ``tritonbundle loadtest`` runs them."""
