"""One Ray actor class per role: Generator, Learner, Reference, RewardWorker."""
