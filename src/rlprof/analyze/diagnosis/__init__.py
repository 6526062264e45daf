"""Why a step is slow: the RL measures over the rows, the registry of causes, the findings they make, what each
cause's first lever saves, ranks against each other, and the sentences that say them; a captured window's verdict;
how far each row runs from its device's limits (the speed of light) and the work it did.
Uses `window`, `inputs` and `tables`."""
