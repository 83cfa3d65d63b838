from vf_calc_v04.taskset import CalcTaskset

__all__ = ["CalcTaskset"]
