"""Paper B (Christian et al., "Reward Models Inherit Value Biases from Pretraining", ICLR 2026): dictionary
categories (Big Two, MFD 2.0) with the authors' mixed model, value trajectories over training
checkpoints, the published data's readers (:mod:`.published`), the paper's figures (:mod:`.plots`) and
``rmfast reproduce --papers b`` (:mod:`.reproduce`)."""
