"""Workers: tasks resume by themselves, on one machine or many.

``submit`` queues a task (:mod:`overnight.fleet.submit`); ``overnight worker`` claims queued and
taken-over tasks and runs each in a child process with the runner (:mod:`overnight.fleet.worker`,
:mod:`overnight.fleet.child`). The queue itself is :mod:`overnight.store.queue`.
"""
