"""leakgym.models"""
