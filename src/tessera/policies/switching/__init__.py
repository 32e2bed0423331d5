"""OServe's predictive switching: whether a forecast workload pays for a new layout, and which.

The loop's span step, its candidates and current deployment, the planner's pricing, and the
parameter switch plan with its LP lower bound. Run by the switching loop in control/.
"""
