"""Vendored by `tritonbundle build`: the package modules the model next to this folder imports."""
