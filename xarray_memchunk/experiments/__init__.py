"""Experiments on real clusters: plan safety, the GST3D seed experiment, worker diagnostics."""
