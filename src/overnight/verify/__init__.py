"""Checks only (nothing here writes): ``fsck`` (:mod:`~overnight.verify.fsck`), fingerprints of the
world a resume depends on (:mod:`~overnight.verify.fingerprint`) and drift detection
(:mod:`~overnight.verify.drift`)."""
