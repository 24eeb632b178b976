"""The object model: checkpoint records and how they chain.

* :mod:`~overnight.chain.records` -- the record format (typed schemas; spec ``docs/FORMAT.md``);
* :mod:`~overnight.chain.pages` -- paged done list, todo and artifact map;
* :mod:`~overnight.chain.integrity` -- build a record, and load one back only when it verifies;
* :mod:`~overnight.chain.read` -- load a branch head, with fallback past bad checkpoints;
* :mod:`~overnight.chain.write` -- the commit path (``ChainWriter``);
* :mod:`~overnight.chain.branches` -- fork, rollback, merge, history;
* :mod:`~overnight.chain.rollback` -- detect a ref moved back; :mod:`~overnight.chain.reachability`
  -- lineage and the objects a checkpoint needs; :mod:`~overnight.chain.migrate` -- format upgrades.
"""
