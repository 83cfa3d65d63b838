"""The environment SDK: datasets of tasks, rollout logic, rubrics, parsers and discovery."""

from rlkit.envs.environment import Environment
from rlkit.envs.group import EnvGroup
from rlkit.envs.loader import load_environment
from rlkit.envs.multiturn import MultiTurnEnv, SingleTurnEnv
from rlkit.envs.parsers import Parser, ThinkParser, XMLParser, extract_boxed_answer
from rlkit.envs.resolve import list_environments
from rlkit.envs.rollout import Rollout, TrainingTokens, Turn
from rlkit.envs.rubric import Rubric
from rlkit.envs.tools import ToolEnv

__all__ = [
    "EnvGroup",
    "Environment",
    "MultiTurnEnv",
    "Parser",
    "Rollout",
    "Rubric",
    "SingleTurnEnv",
    "ThinkParser",
    "ToolEnv",
    "TrainingTokens",
    "Turn",
    "XMLParser",
    "extract_boxed_answer",
    "list_environments",
    "load_environment",
]
