"""Tests of the test harness itself: the control plane is what it claims to be, and the kwok
nodes follow the conventions the operator's tests rely on (hack/README.md)."""
