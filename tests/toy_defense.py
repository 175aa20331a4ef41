"""Toy defenses in a few lines: what adding a defense to LeakGym takes (see test_defenses_registry and
test_extending)."""

from leakgym.defenses import BitMenu, UpdateDefense, int_field, real_field


class ToyScale(UpdateDefense):
    """Multiply the shared update by ``toy_scale`` (a sign flip at -1)."""

    name = "toy_scale"
    fields = (real_field("toy_scale", 1.0, "Multiply the update by this factor; 1 off.", low=-2.0, high=2.0),)

    def apply(self, ctx, update, x, y):
        return {k: ctx.config.toy_scale * t for k, t in update.items()}, {"factor": ctx.config.toy_scale}

    def cost(self, config):
        return 0.25


class ToyMask(UpdateDefense):
    """A toy with what a scenario bounds and offers bit by bit: scales the update by
    ``1 - 0.25 * (number of bits of toy_mask on)``, ``toy_repeats`` times."""

    name = "toy_mask"
    fields = (
        # a bit mask: a scenario offers one on/off action dimension per bit it names in toy_mask_bits
        int_field("toy_mask", 0, "Toy bit mask: 1 'first', 2 'second' quarter off the scale; 0 off.", high=3,
                  bit_menu=BitMenu("toy_mask_bits", {"first": 1, "second": 2}, what="toy quarter")),
        # an inner loop with a documented limit (LIMITS["toy_repeats"], lifted by allow_large)
        int_field("toy_repeats", 1, "Toy repetitions of the scaling.", low=1, limit=8),
        # bounded by a scenario option: no more than the victim's batch
        int_field("toy_group", 0, "Toy group size.", limit_option="batch_size",
                  limit_why="groups up to k images of the private batch; needs k <= batch_size"),
    )

    def apply(self, ctx, update, x, y):
        factor = (1.0 - 0.25 * ctx.config.toy_mask.bit_count()) ** ctx.config.toy_repeats
        return {k: factor * t for k, t in update.items()}, {"factor": factor}
