"""TensorRT: ``plugin.py`` (config, engine builds), ``engine.py`` (TensorRT API steps), ``check.py`` (plans)."""
