"""What the tests use that is not a test: helpers, probes and scripts the tests import or launch."""
