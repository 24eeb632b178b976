"""Operations that delete or move stored data -- the only code that does: ``gc`` and ``rm``
(:mod:`~overnight.ops.gc`), ``archive``/``restore`` (:mod:`~overnight.ops.archive`), replica repair
(:mod:`~overnight.ops.repair`) and salvaging a damaged SQLite file (:mod:`~overnight.ops.salvage`)."""
