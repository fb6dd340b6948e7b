"""``tritonbundle tune``: pick the serving configuration from the traffic sample and an SLO, by
measuring candidates on the real server.

* :mod:`.space`: the knobs, their candidate values and the seed computed from the SLO, the machine
  and (on a GPU) the engine's measured launch times (pure)
* :mod:`.search`: coordinate descent over the knobs, every point kept (pure: it calls a measure function)
* :mod:`.run`: each candidate written by the build stage, served by the real tritonserver, its rate at
  the SLO found by the measurement core's open-model search; :mod:`.report`: the results
* :mod:`.result`: the run as a typed record (``tune.json`` is its ``to_json()``; ``from_json()`` reads
  one back for ``bench --tuned`` and :mod:`.capacity`)
"""
