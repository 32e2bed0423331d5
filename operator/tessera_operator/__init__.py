"""Kopf operator reconciling ServingDeployment custom resources."""
