"""How data reaches the ranks: a global batch split over ranks and micro-batches, the samplers, and
what a batch is made of sample by sample."""
