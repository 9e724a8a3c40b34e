"""The room for one pack: the pack's types, its result, one run of the core's pack, and the
history index kept between turns."""
