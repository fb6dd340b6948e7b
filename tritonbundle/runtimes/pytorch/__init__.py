"""PyTorch: ``plugin.py`` (config, files, weights), ``model.py`` (served), ``engine.py``, ``launch.py``, ``stats.py``."""
