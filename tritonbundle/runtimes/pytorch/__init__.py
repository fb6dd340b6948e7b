"""PyTorch: ``plugin.py`` (config, files, weights), ``model.py`` (served), ``engine.py``, ``launch.py`` (statistics: ``runtimes/stats.py``)."""
