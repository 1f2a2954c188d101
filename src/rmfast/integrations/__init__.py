"""rmfast inside other tools' loops. :mod:`rmfast.integrations.trl`: a Trainer callback (TRL's
``RewardTrainer`` or any Hugging Face ``Trainer``) that x-rays the reward model as it trains.
Nothing else in rmfast imports this package."""
