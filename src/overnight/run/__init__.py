"""Running a task: the session loop and everything a step runs with.

* :mod:`~overnight.run.task` -- ``Task`` and ``@task.step``; :mod:`~overnight.run.loader` -- the
  one place task code is imported;
* :mod:`~overnight.run.runner` -- the session loop (lease, signals, commit after every step);
* :mod:`~overnight.run.context` -- what a step receives; :mod:`~overnight.run.session` -- the
  model gateway and the context window;
* :mod:`~overnight.run.drift` -- the drift decision at resume (detection is
  :mod:`overnight.verify.drift`); :mod:`~overnight.run.router` -- the router decision (level, media).
"""
