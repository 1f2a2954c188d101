"""Hidden states and the reward lens: layer × layer similarity (CKA, RV2; :mod:`.similarity` with its guards
and progress), the models × models RSA of representations (:mod:`.representation_rsa`), the lens
(:mod:`.lens`) and how the report and the explorer show them (:mod:`.views`)."""
