"""What every analysis stands on: the tidy scan frame and its loaders, the lexicons and model metadata
they join to, prompt framing, the shared vocabulary, and the shapes of a result (:class:`.results.Result`)
and of its ledger of dropped rows (:class:`.ledger.Ledger`). Nothing here imports another analysis package."""
