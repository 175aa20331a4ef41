"""A toy defense in a few lines: what adding a defense to LeakGym takes (see test_defenses_registry)."""

from leakgym.defenses import UpdateDefense, real_field


class ToyScale(UpdateDefense):
    """Multiply the shared update by ``toy_scale`` (a sign flip at -1)."""

    name = "toy_scale"
    fields = (real_field("toy_scale", 1.0, "Multiply the update by this factor; 1 off.", low=-2.0, high=2.0),)

    def apply(self, ctx, update, x, y):
        return {k: ctx.config.toy_scale * t for k, t in update.items()}, {"factor": ctx.config.toy_scale}

    def cost(self, config):
        return 0.25
