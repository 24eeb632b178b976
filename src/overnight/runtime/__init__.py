"""Running a task: the session loop and everything a step runs with.

* :mod:`~overnight.runtime.task` -- ``Task`` and ``@task.step``; :mod:`~overnight.runtime.task_code` -- the
  one place task code is imported;
* :mod:`~overnight.runtime.runner` -- the session loop (lease, signals, commit after every step);
* :mod:`~overnight.runtime.context` -- what a step receives; :mod:`~overnight.runtime.session` -- the
  model gateway and the context window;
* :mod:`~overnight.runtime.drift_decision` -- the drift decision at resume (detection is
  :mod:`overnight.verify.drift`); :mod:`~overnight.runtime.router` -- the router decision (level, media).
"""
