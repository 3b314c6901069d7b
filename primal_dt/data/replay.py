"""D4RL's medium-replay recipe: train SAC until it reaches a "medium" return, keep all it saw.

D4RL's medium-replay datasets hold every transition in the replay buffer of the SAC agent whose
final policy became the "medium" one. Here the training environment is wrapped so that each
transition is recorded, episode by episode, as it happens; the agent is evaluated every few
thousand steps and training stops once its mean evaluation return reaches the target, or when
the step budget runs out. Needs Stable-Baselines3 (pip install 'primal-dt[record]').
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from minari.data_collector.episode_buffer import EpisodeBuffer
from stable_baselines3 import SAC
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv

from primal_dt.data.tasks import make_env


class EpisodeRecorder(gym.Wrapper):
    """Keeps every transition that passes through the environment, as Minari episode buffers."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.episodes: list[EpisodeBuffer] = []
        self._steps: dict[str, list[Any]] | None = None
        self._seed: int | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        self.finish()
        observation, info = self.env.reset(seed=seed, options=options)
        self._seed = seed
        self._steps = {
            "observations": [observation],
            "actions": [],
            "rewards": [],
            "terminations": [],
            "truncations": [],
        }
        return observation, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict]:
        observation, reward, terminated, truncated, info = self.env.step(action)
        assert self._steps is not None, "step() before reset()"
        for key, value in (
            ("observations", observation),
            ("actions", action),
            ("rewards", reward),
            ("terminations", terminated),
            ("truncations", truncated),
        ):
            self._steps[key].append(value)
        if terminated or truncated:
            self.finish()
        return observation, reward, terminated, truncated, info

    def finish(self) -> None:
        """Close the episode in progress; one cut short (training stopped) ends truncated."""
        steps, self._steps = self._steps, None
        if not steps or not steps["rewards"]:
            return
        if not (steps["terminations"][-1] or steps["truncations"][-1]):
            steps["truncations"][-1] = True
        self.episodes.append(
            EpisodeBuffer(
                id=len(self.episodes),
                seed=self._seed,
                observations=np.asarray(steps["observations"]),
                actions=np.asarray(steps["actions"], dtype=self.action_space.dtype),
                rewards=np.asarray(steps["rewards"], dtype=np.float64),
                terminations=np.asarray(steps["terminations"]),
                truncations=np.asarray(steps["truncations"]),
            )
        )


class _EvaluateAndStop(BaseCallback):
    """Every `every` steps, the mean deterministic return; stop once it reaches the target."""

    def __init__(
        self, eval_env: DummyVecEnv, target: float, every: int, episodes: int, log: Callable
    ) -> None:
        super().__init__()
        self.eval_env, self.target, self.every, self.episodes = eval_env, target, every, episodes
        self.log = log
        self.history: list[tuple[int, float]] = []

    def _on_step(self) -> bool:
        if self.num_timesteps % self.every:
            return True
        returns, _ = evaluate_policy(
            self.model,
            self.eval_env,
            n_eval_episodes=self.episodes,
            deterministic=True,
            return_episode_rewards=True,
        )
        mean = float(np.mean(returns))
        self.history.append((self.num_timesteps, mean))
        self.log(f"step {self.num_timesteps}: evaluation return {mean:.1f} (target {self.target})")
        return mean < self.target


@dataclass
class SacTraining:
    """What SAC saw while training (every episode), and the return it reached."""

    episodes: list[EpisodeBuffer]
    model: SAC
    steps: int
    reached: bool
    history: list[tuple[int, float]] = field(default_factory=list)


def train_sac_replay(
    env_id: str,
    target_return: float,
    max_steps: int,
    seed: int = 0,
    eval_every: int = 5000,
    eval_episodes: int = 5,
    learning_starts: int = 10000,
    device: str = "cpu",
    log: Callable[[str], None] = lambda message: None,
) -> SacTraining:
    """Train SAC (Stable-Baselines3 defaults) in env_id, recording every transition it makes. On
    the CPU by default, as recording.py records: SB3's CUDA path would also set cuDNN's global
    flags in this process."""
    recorder = EpisodeRecorder(make_env(env_id))
    eval_env = DummyVecEnv([lambda: Monitor(make_env(env_id))])
    eval_env.seed(seed + 1)
    callback = _EvaluateAndStop(eval_env, target_return, eval_every, eval_episodes, log)
    model = SAC("MlpPolicy", recorder, learning_starts=learning_starts, seed=seed, device=device)
    model.set_logger(Logger(folder=None, output_formats=[]))  # else SB3 leaves a folder in /tmp
    try:
        model.learn(total_timesteps=max_steps, callback=callback)
    finally:
        recorder.finish()
        recorder.close()
        eval_env.close()
    reached = bool(callback.history) and callback.history[-1][1] >= target_return
    return SacTraining(recorder.episodes, model, model.num_timesteps, reached, callback.history)
