"""Paper A (Christian et al., FAccT 2025): score distributions, agreement between models (and of a model
with itself across prompts), sentiment and framing, mere exposure, best vs worst, the comparison with
human preferences (EloEverything, whose published data :mod:`.eloeverything` reads), the top/bottom
tables, the paper's own figures (:mod:`.plots`) and ``rmfast reproduce --papers a`` (:mod:`.reproduce`)."""
