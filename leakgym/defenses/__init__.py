"""leakgym.defenses"""
