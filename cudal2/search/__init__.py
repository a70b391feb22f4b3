"""Search over our kernel families: the cost model and the tuner (the families themselves are
cudal2.templates: kernel source is data)."""
