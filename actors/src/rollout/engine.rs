//! The streaming engine behind [`super::run_episodes`] (RO-8): one state machine per episode,
//! env answers arriving on a channel, one sampler per model stepped in turn.
//!
//! An episode goes env (reset / restore) → sampler → env (step) → sampler … → done. The loop
//! drains every env answer that has arrived, then runs one decode step of every busy sampler;
//! when every sampler is idle it blocks on the next answer. Nothing waits for an episode it does
//! not need: a finished group is judged at once, and under dynamic sampling its re-roll joins
//! the same stream (RO-9).

use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use actix::Addr;
use keel_envs::{
    EnvSnapshot, Resumed, ResumedNext, SampledToken, SampledTurn, StepOutcome, TurnLimits,
};
use keel_learner::hf::{ChatCodec, Completion, FinishReason, GenRequest, Sampler, SamplingParams};

use super::episode_record;
use super::turn_sampler::TurnSampler;
use keel_store::{RolloutBatch, Trajectory, Turn, VersionChange};

use super::{
    model_slot, uninformative, unix_ms, BoundaryState, ModelSource, RolloutExtras, RolloutSpec,
    RolloutStats, MAX_SAMPLER_SLOTS,
};
use crate::demo_tokens::{chat_messages, scaffolded_prompt};
use crate::env_shard::{
    CloseEpisodes, EnvAnswer, EnvOp, EnvReply, EnvRequest, EnvShard, EpisodeError, Reply,
    ResetOutcome,
};
use crate::error::ActorError;
use crate::seeds::mix_seed;
use crate::vllm::EngineSampler;

/// How long the engine waits for an env answer before looking again (nothing else is to do
/// while it waits: every sampler is idle).
const ANSWER_POLL: Duration = Duration::from_millis(200);

struct Episode {
    id: u64,
    /// Index of its plan in the spec.
    plan: usize,
    /// 0 = the first roll-out of its plan; k = the k-th re-roll (RO-9).
    attempt: usize,
    shard: usize,
    /// The segment being sampled (the whole episode unless its agent rewrote its history).
    traj: Trajectory,
    /// Its earlier segments, in order (AGT-3, RB-4).
    segments: Vec<Trajectory>,
    done: bool,
    failed: bool,
    success: bool,
    agent: u32,
    anchor: u64,
    anchor_state: String,
    task_type: String,
    boundaries: Vec<BoundaryState>,
    /// Where the turn being sampled or stepped starts.
    turn_start: usize,
    /// The policy version in force when that turn was queued (RO-10).
    turn_version: u64,
    /// The digest of those weights (WB-5).
    turn_digest: u64,
    /// The versions that took over while that turn was sampled (RO-10, RB-5).
    turn_changes: Vec<VersionChange>,
    /// When the episode ended (RO-8).
    finished: Option<Instant>,
    /// The env ended the episode (so its shard already dropped it).
    env_ended: bool,
    /// The env reads its turns' token log-probs (`Env::wants_token_logprobs`).
    token_logprobs: bool,
    /// The env journals the episode's record before answering (`Env::journals`, AJ-1).
    journals: bool,
    /// What the env asks of the next turn (`Env::next_turn`): a smaller token limit, stop
    /// strings.
    next_turn: TurnLimits,
}

/// One group's roll-outs under dynamic sampling (RO-9).
#[derive(Default)]
struct Group {
    /// Its plans, in spec order.
    plans: Vec<usize>,
    /// Episodes of each attempt.
    attempts: Vec<Vec<usize>>,
    /// Episodes of the last attempt still running.
    open: usize,
    /// The attempt that became informative (None: keep attempt 0).
    chosen: Option<usize>,
}

fn shard_of(episode: u64, n: usize) -> usize {
    (episode % n as u64) as usize
}

/// Ends episodes `ids` on every shard that may still run them (their envs, agents included).
fn close_on_shards(shards: &[Addr<EnvShard>], ids: Vec<u64>) {
    if ids.is_empty() {
        return;
    }
    for shard in shards {
        shard.do_send(CloseEpisodes(ids.clone()));
    }
}

fn push_context(traj: &mut Trajectory, ids: &[u32]) {
    traj.loss_mask.extend(std::iter::repeat_n(0u8, ids.len()));
    traj.behaviour_logprobs
        .extend(std::iter::repeat_n(0f32, ids.len()));
    traj.tokens.extend_from_slice(ids);
}

/// The prompt a new segment starts from (RO-12): its conversation rendered by the chat
/// template, or a text segment's prompt as is (AGT-8).
fn segment_prompt(codec: &ChatCodec, segment: &keel_envs::Segment) -> Result<Vec<u32>, ActorError> {
    Ok(match &segment.text {
        Some(text) => codec.text(text, true)?,
        None => codec.conversation(&chat_messages(&segment.messages), &segment.tools)?,
    })
}

/// The run's sampling parameters as the env asks its next turn to be (`Env::next_turn`): a
/// smaller token limit, stop strings.
fn turn_params(run: &SamplingParams, asked: TurnLimits) -> SamplingParams {
    let mut params = run.clone();
    if let Some(m) = asked.max_tokens {
        params.max_new_tokens = params.max_new_tokens.min(m).max(1);
    }
    params.stop_strings = asked.stop;
    params
}

/// A turn's content tokens with their log-probs, for envs that report them (an undecodable
/// turn has none: its text is empty too).
fn content_tokens(codec: &ChatCodec, c: &Completion) -> Vec<SampledToken> {
    let texts = codec.token_texts(&c.tokens).unwrap_or_default();
    texts
        .into_iter()
        .zip(&c.logprobs)
        .map(|(text, &logprob)| SampledToken { text, logprob })
        .collect()
}

/// One rollout in flight (module doc).
pub(super) struct Engine<'a> {
    policies: &'a mut dyn ModelSource,
    /// The policy version in force (RO-10).
    version: u64,
    codec: &'a ChatCodec,
    shards: &'a [Addr<EnvShard>],
    spec: &'a RolloutSpec,
    episodes: Vec<Episode>,
    by_id: HashMap<u64, usize>,
    groups: BTreeMap<u64, Group>,
    samplers: Vec<Option<TurnSampler>>,
    stats: RolloutStats,
    params: SamplingParams,
    answers: (mpsc::Sender<EnvAnswer>, mpsc::Receiver<EnvAnswer>),
    last_failure: Option<String>,
    /// Requests sent to shards and not answered yet.
    in_env: usize,
    started: Instant,
    /// The digest of each version taken in flight (RO-10).
    digests: HashMap<u64, u64>,
}

impl<'a> Engine<'a> {
    pub(super) fn new(
        policies: &'a mut dyn ModelSource,
        codec: &'a ChatCodec,
        shards: &'a [Addr<EnvShard>],
        spec: &'a RolloutSpec,
    ) -> Self {
        let start_digest = policies.weights_digest();
        let mut groups: BTreeMap<u64, Group> = BTreeMap::new();
        for (k, plan) in spec.plans.iter().enumerate() {
            groups.entry(plan.group_id).or_default().plans.push(k);
        }
        Engine {
            policies,
            version: spec.policy_version,
            codec,
            shards,
            spec,
            episodes: Vec::with_capacity(spec.plans.len()),
            by_id: HashMap::with_capacity(spec.plans.len()),
            groups,
            samplers: Vec::new(),
            stats: RolloutStats::default(),
            params: SamplingParams {
                temperature: if spec.greedy { 0.0 } else { spec.temperature },
                max_new_tokens: spec.max_turn_tokens,
                stop_token_ids: codec.stop_ids().to_vec(),
                ..SamplingParams::default()
            },
            answers: mpsc::channel(),
            last_failure: None,
            in_env: 0,
            started: Instant::now(),
            digests: HashMap::from([(spec.policy_version, start_digest)]),
        }
    }

    /// Starts attempt `attempt` of plan `plan`: a fresh episode, reset or restored by its shard.
    fn launch(&mut self, plan: usize, attempt: usize) {
        let p = &self.spec.plans[plan];
        // Attempt a of plan k is trajectory first_id + a·plans + k: unique within the batch.
        let plans = self.spec.plans.len() as u64;
        let id = self.spec.first_id + attempt as u64 * plans + plan as u64;
        let i = self.episodes.len();
        self.episodes.push(Episode {
            id,
            plan,
            attempt,
            shard: shard_of(id, self.shards.len()),
            traj: Trajectory {
                trajectory_id: id,
                episode_id: id,
                group_id: p.group_id,
                task_id: p.task.task_id,
                env_name: self.spec.env_name.clone(),
                agent_id: 0,
                tokens: Vec::new(),
                loss_mask: Vec::new(),
                behaviour_logprobs: Vec::new(),
                turns: Vec::new(),
                final_reward: 0.0,
                source: p.source,
                scaffold_version: 0,
                trained_turn: p.start.as_ref().map(|_| 0),
            },
            segments: Vec::new(),
            done: false,
            failed: false,
            success: false,
            agent: 0,
            anchor: 0,
            anchor_state: String::new(),
            task_type: String::new(),
            boundaries: Vec::new(),
            turn_start: 0,
            turn_version: self.spec.policy_version,
            turn_digest: self.policies.weights_digest(),
            turn_changes: Vec::new(),
            finished: None,
            env_ended: false,
            token_logprobs: false,
            journals: false,
            next_turn: TurnLimits::default(),
        });
        self.by_id.insert(id, i);
        if let Some(g) = self.groups.get_mut(&p.group_id) {
            if g.attempts.len() <= attempt {
                g.attempts.resize_with(attempt + 1, Vec::new);
            }
            g.attempts[attempt].push(i);
            g.open += 1;
        }
        let op = match &p.start {
            None => EnvOp::Reset(p.task.task_seed),
            Some(b) => EnvOp::Restore(b.snapshot.clone()),
        };
        self.send_to_env(i, op);
    }

    /// Sends one episode's request to its shard; the answer comes back on the channel.
    fn send_to_env(&mut self, i: usize, op: EnvOp) {
        let ep = &self.episodes[i];
        self.shards[ep.shard].do_send(EnvRequest {
            episode: ep.id,
            op,
            snapshot: self.spec.capture_boundaries,
            reply: Reply::to_channel(ep.id, self.answers.0.clone()),
        });
        self.in_env += 1;
    }

    /// Runs every episode to its end: no episode waits for another (RO-8).
    pub(super) fn run(&mut self) -> Result<(), ActorError> {
        for plan in 0..self.spec.plans.len() {
            self.launch(plan, 0);
        }
        loop {
            if self.spec.stop.as_ref().is_some_and(|s| s.requested()) {
                // RO-13: close what runs on the shards (agents included), keep nothing.
                close_on_shards(self.shards, self.episodes.iter().map(|e| e.id).collect());
                return Err(ActorError::Interrupted);
            }
            while let Ok(answer) = self.answers.1.try_recv() {
                self.on_answer(answer)?;
            }
            let busy: Vec<usize> = (0..self.samplers.len())
                .filter(|&s| self.samplers[s].as_ref().is_some_and(|x| !x.is_idle()))
                .collect();
            if busy.is_empty() {
                if self.in_env == 0 {
                    return Ok(());
                }
                // Every sampler is idle: wait for the env.
                if let Ok(answer) = self.answers.1.recv_timeout(ANSWER_POLL) {
                    self.on_answer(answer)?;
                }
                continue;
            }
            if self.spec.follow_weights {
                if let Some(v) = self.policies.refresh()? {
                    self.version = v;
                    self.digests.insert(v, self.policies.weights_digest());
                    self.stats.weight_updates += 1;
                    self.samplers
                        .iter_mut()
                        .flatten()
                        .for_each(|s| s.mark_version(v));
                }
            }
            for slot in busy {
                let model = self.policies.model(slot)?;
                let Some(sampler) = self.samplers[slot].as_mut() else {
                    continue;
                };
                for (i, completion) in sampler.step(model)? {
                    self.on_completion(i, completion);
                }
            }
        }
    }

    /// A sampled turn: record it and send its action to the env. A turn that does not decode
    /// is an empty (invalid) action, never an error.
    fn on_completion(&mut self, i: usize, c: Completion) {
        let ep = &mut self.episodes[i];
        let first = ep.traj.tokens.len();
        for &(k, v) in &c.versions {
            let digest = self.digests.get(&v).copied().unwrap_or(0);
            if k == 0 {
                (ep.turn_version, ep.turn_digest) = (v, digest);
            } else if k < c.tokens.len() {
                ep.turn_changes.push(VersionChange {
                    at: (first + k) as u32,
                    policy_version: v,
                    weights_digest: digest,
                });
            }
        }
        let mut turn = SampledTurn {
            tokens: match ep.token_logprobs {
                true => content_tokens(self.codec, &c),
                false => Vec::new(),
            },
            prompt_tokens: ep.traj.tokens.len(),
            completion_tokens: c.tokens.len(),
            truncated: c.finish == FinishReason::Length,
            ..SampledTurn::default()
        };
        let t = &mut ep.traj;
        self.stats.sampled_tokens += c.tokens.len();
        t.loss_mask.extend(std::iter::repeat_n(1u8, c.tokens.len()));
        t.tokens.extend(c.tokens);
        t.behaviour_logprobs.extend(c.logprobs);
        turn.text = self
            .codec
            .response_text(&t.tokens[ep.turn_start..])
            .unwrap_or_default();
        if ep.journals {
            match self.episode_record(i) {
                Ok(record) => turn.record = record,
                Err(e) => {
                    let e = EpisodeError::Failed(self.episodes[i].id, e);
                    self.fail(i, &e);
                    return;
                }
            }
        }
        self.send_to_env(i, EnvOp::Step(turn));
    }

    /// The episode so far with the turn just sampled, as its env journals it (AJ-1, JR-1).
    fn episode_record(&self, i: usize) -> Result<Vec<u8>, String> {
        let ep = &self.episodes[i];
        let turn = Turn {
            start: ep.turn_start as u32,
            end: ep.traj.tokens.len() as u32,
            policy_version: ep.turn_version,
            weights_digest: ep.turn_digest,
            reward: 0.0,
            invalid_action: false,
            agent_id: ep.agent,
            anchor_key: ep.anchor,
            anchor_state: String::new(),
            version_changes: ep.turn_changes.clone(),
        };
        episode_record::encode(&ep.segments, &ep.traj, turn, self.version)
    }

    /// An episode its env took up from an earlier process (AJ-3): its recorded segments, then
    /// a new one from the agent's call, or its end. False when it ended (or was dropped).
    fn resumed_episode(&mut self, i: usize, resumed: Resumed) -> Result<bool, ActorError> {
        let ep = &self.episodes[i];
        let mut restored = match episode_record::decode(&resumed.record, &ep.traj, self.version) {
            Ok(r) => r,
            Err(e) => {
                let e = EpisodeError::Failed(ep.id, e);
                self.fail(i, &e);
                return Ok(false);
            }
        };
        self.stats.resumed_episodes += 1;
        match resumed.next {
            ResumedNext::Segment(segment) => {
                let ids = segment_prompt(self.codec, &segment)?;
                self.stats.prompt_tokens += ids.len();
                let ep = &mut self.episodes[i];
                ep.segments = restored;
                push_context(&mut ep.traj, &ids);
                Ok(true)
            }
            ResumedNext::Ended(reward) => {
                let ep = &mut self.episodes[i];
                let Some(mut last) = restored.pop() else {
                    let e = EpisodeError::Failed(ep.id, "its journal record is empty".into());
                    self.fail(i, &e);
                    return Ok(false);
                };
                if let Some(t) = last.turns.last_mut() {
                    t.reward = reward;
                }
                last.final_reward = reward;
                (ep.segments, ep.traj) = (restored, last);
                ep.success = reward >= 1.0;
                self.end(i);
                Ok(false)
            }
        }
    }

    fn on_answer(&mut self, answer: EnvAnswer) -> Result<(), ActorError> {
        self.in_env = self.in_env.saturating_sub(1);
        let Some(&i) = self.by_id.get(&answer.episode) else {
            return Err(ActorError::Internal(format!(
                "an env shard answered for unknown episode {}",
                answer.episode
            )));
        };
        match answer.result {
            Ok(EnvReply::Started(start)) => {
                if !self.started_episode(i, start)? {
                    return Ok(());
                }
            }
            Ok(EnvReply::Restored) => {
                let plan = &self.spec.plans[self.episodes[i].plan];
                let ep = &mut self.episodes[i];
                match &plan.start {
                    Some(b) => {
                        push_context(&mut ep.traj, &b.tokens);
                        ep.agent = b.agent_id;
                        ep.anchor = b.anchor_key;
                        ep.anchor_state = b.anchor_state.clone();
                        ep.task_type = b.task_type.clone();
                    }
                    None => {
                        let lost = EpisodeError::Lost(ep.id);
                        self.fail(i, &lost);
                        return Ok(());
                    }
                }
            }
            Ok(EnvReply::Stepped { outcome, next_turn }) => {
                self.episodes[i].next_turn = next_turn;
                if !self.stepped(i, outcome)? {
                    return Ok(());
                }
            }
            Err(e) => {
                self.fail(i, &e);
                return Ok(());
            }
        }
        self.next_turn(i, answer.snapshot)
    }

    /// Records an episode's start; false when it already ended (a taken-up episode, AJ-3).
    fn started_episode(&mut self, i: usize, mut start: ResetOutcome) -> Result<bool, ActorError> {
        {
            let ep = &mut self.episodes[i];
            ep.agent = start.agent_id;
            ep.anchor = start.anchor_key;
            ep.task_type = start.task_type.clone();
            ep.token_logprobs = start.token_logprobs;
            ep.journals = start.journals;
            ep.next_turn = std::mem::take(&mut start.next_turn);
        }
        if let Some(resumed) = start.resumed.take() {
            return self.resumed_episode(i, resumed);
        }
        let (scaffold, version) = match &self.spec.scaffold {
            Some(render) => render(&start.task_type),
            None => (String::new(), 0),
        };
        let ids = match start.text_prompt {
            true => self.codec.text(&start.prompt, true)?,
            false => self.codec.prompt_with_tools(
                &chat_messages(&start.preamble),
                &scaffolded_prompt(&scaffold, &start.prompt),
                &start.tools,
            )?,
        };
        self.stats.prompt_tokens += ids.len();
        let ep = &mut self.episodes[i];
        if !scaffold.is_empty() {
            self.stats.scaffold_tokens += self.codec.count(&scaffold)?;
            ep.traj.scaffold_version = version;
        }
        push_context(&mut ep.traj, &ids);
        ep.anchor_state = start.anchor_state;
        Ok(true)
    }

    /// Records a stepped turn; false when the episode ended.
    fn stepped(&mut self, i: usize, mut outcome: StepOutcome) -> Result<bool, ActorError> {
        let ep = &mut self.episodes[i];
        let (version, digest) = (ep.turn_version, ep.turn_digest);
        self.stats.turns += 1;
        self.stats.invalid_turns += usize::from(outcome.invalid_action);
        ep.traj.turns.push(Turn {
            start: ep.turn_start as u32,
            end: ep.traj.tokens.len() as u32,
            policy_version: version,
            weights_digest: digest,
            reward: outcome.reward,
            invalid_action: outcome.invalid_action,
            agent_id: ep.agent,
            anchor_key: ep.anchor,
            anchor_state: if self.spec.keep_anchor_states {
                std::mem::take(&mut ep.anchor_state)
            } else {
                String::new()
            },
            version_changes: std::mem::take(&mut ep.turn_changes),
        });
        ep.agent = outcome.agent_id;
        ep.anchor = outcome.anchor_key;
        ep.anchor_state = std::mem::take(&mut outcome.anchor_state);
        if outcome.done {
            ep.env_ended = true;
            ep.traj.final_reward = outcome.reward;
            ep.success = outcome.reward >= 1.0;
            self.end(i);
            return Ok(false);
        }
        if let Some(segment) = outcome.segment.take() {
            // RO-12: the trajectory so far is a segment; the next one starts from this prompt.
            let ids = segment_prompt(self.codec, &segment)?;
            self.stats.prompt_tokens += ids.len();
            let fresh = Trajectory {
                tokens: Vec::new(),
                loss_mask: Vec::new(),
                behaviour_logprobs: Vec::new(),
                turns: Vec::new(),
                env_name: ep.traj.env_name.clone(),
                ..ep.traj
            };
            ep.segments.push(std::mem::replace(&mut ep.traj, fresh));
            push_context(&mut ep.traj, &ids);
            return Ok(true);
        }
        // The env's messages: `tool` answers a function call (DS-8), an agent's new ones
        // (AGT-1); a text episode's raw continuation (AGT-8).
        let ids = match &outcome.text {
            Some(text) => self.codec.text(text, false)?,
            None => self.codec.observation_messages(
                ep.traj.tokens.last().copied(),
                &chat_messages(&outcome.observation_messages()),
            )?,
        };
        push_context(&mut ep.traj, &ids);
        Ok(true)
    }

    /// The episode's observation is in: truncate it if another turn cannot fit, else record the
    /// boundary (RO-5) and queue its next turn in its model's sampler.
    fn next_turn(&mut self, i: usize, snapshot: Option<EnvSnapshot>) -> Result<(), ActorError> {
        let spec = self.spec;
        let ep = &mut self.episodes[i];
        if ep.traj.tokens.len() + spec.max_turn_tokens + 8 > spec.context_len {
            if ep.traj.turns.is_empty() {
                // RO-11: a prompt that leaves no room for a turn never reaches the learner.
                let e = EpisodeError::Failed(
                    ep.id,
                    format!(
                        "its prompt of {} tokens leaves no room for a turn of rollout.max_turn_tokens = {} within model.context_len = {}",
                        ep.traj.tokens.len(),
                        spec.max_turn_tokens,
                        spec.context_len
                    ),
                );
                self.fail(i, &e);
                return Ok(());
            }
            // RO-11: the observation past the bound is cut; no sampled token is.
            let keep = ep.traj.tokens.len().min(spec.context_len);
            ep.traj.tokens.truncate(keep);
            ep.traj.loss_mask.truncate(keep);
            ep.traj.behaviour_logprobs.truncate(keep);
            self.end(i);
            return Ok(());
        }
        if spec.capture_boundaries {
            let Some(snapshot) = snapshot else {
                let e = EpisodeError::Failed(ep.id, "the shard sent no boundary snapshot".into());
                self.fail(i, &e);
                return Ok(());
            };
            ep.boundaries.push(BoundaryState {
                tokens: ep.traj.tokens.clone(),
                snapshot,
                agent_id: ep.agent,
                anchor_key: ep.anchor,
                anchor_state: ep.anchor_state.clone(),
                task_type: ep.task_type.clone(),
            });
        }
        ep.turn_start = ep.traj.tokens.len();
        ep.turn_version = self.version;
        ep.turn_digest = self.policies.weights_digest();
        let slot = model_slot(&*self.policies, ep.traj.source, ep.agent);
        // RO-3: the draw depends on (seed, plan, attempt, turn), never on timing.
        let turn =
            (ep.traj.turns.len() + ep.segments.iter().map(|s| s.turns.len()).sum::<usize>()) as u64;
        let seed = match ep.attempt {
            0 => mix_seed(&[spec.rng_seed, ep.plan as u64, turn]),
            a => mix_seed(&[spec.rng_seed, 7, a as u64, ep.plan as u64, turn]),
        };
        let request = GenRequest {
            prompt: ep.traj.tokens.clone(),
            params: turn_params(&self.params, std::mem::take(&mut ep.next_turn)),
            seed,
        };
        let model = self.policies.model(slot)?;
        if self.samplers.len() <= slot {
            self.samplers.resize_with(slot + 1, || None);
        }
        let sampler = match &mut self.samplers[slot] {
            Some(s) => s,
            empty => empty.insert(match self.policies.engine() {
                Some(client) => TurnSampler::Vllm(EngineSampler::new(client)),
                None => {
                    let mut s = Sampler::new(
                        model,
                        spec.plans.len().clamp(1, MAX_SAMPLER_SLOTS),
                        spec.context_len,
                    )?;
                    s.set_batch_invariant(spec.batch_invariant);
                    s.set_detokenizer(self.codec.detokenizer());
                    TurnSampler::Keel(s)
                }
            }),
        };
        sampler.submit(model, i, request)?;
        Ok(())
    }

    fn fail(&mut self, i: usize, e: &EpisodeError) {
        let ep = &mut self.episodes[i];
        tracing::warn!(episode = ep.id, error = %e, "episode failed; excluded from the batch");
        self.last_failure = Some(e.to_string());
        ep.failed = true;
        self.end(i);
    }

    /// Marks an episode ended; the last one of its group's attempt judges the group (RO-9).
    fn end(&mut self, i: usize) {
        let ep = &mut self.episodes[i];
        if ep.done {
            return;
        }
        ep.done = true;
        ep.finished = Some(Instant::now());
        let group = ep.traj.group_id;
        let closed = self.groups.get_mut(&group).is_some_and(|g| {
            g.open = g.open.saturating_sub(1);
            g.open == 0
        });
        if closed {
            self.judge(group);
        }
    }

    /// RO-9: a finished attempt that became informative is chosen; an uninformative one is
    /// rolled out again (same task, fresh seeds) while tries remain.
    fn judge(&mut self, group: u64) {
        let Some(reroll) = self.spec.reroll else {
            return;
        };
        let Some(g) = self.groups.get(&group) else {
            return;
        };
        let attempt = g.attempts.len() - 1;
        let last = g.attempts[attempt]
            .iter()
            .map(|&i| &self.episodes[i])
            .filter(|e| !e.failed)
            .map(|e| &e.traj);
        if !uninformative(last, reroll.anchors) {
            if let Some(g) = self.groups.get_mut(&group) {
                g.chosen = Some(attempt);
            }
            return;
        }
        if reroll.max_tries != 0 && attempt + 1 >= reroll.max_tries {
            return;
        }
        let plans = g.plans.clone();
        for plan in plans {
            self.launch(plan, attempt + 1);
        }
    }

    /// The batch, in plan order, whatever order the episodes finished in; under dynamic
    /// sampling each group's chosen attempt (RO-9). Stats count every episode sampled.
    pub(super) fn finish(mut self) -> (RolloutBatch, RolloutStats, RolloutExtras) {
        // An episode whose trained (branched) turn never happened cannot be trained. Every
        // episode has ended: this only excludes it (no group is judged again).
        for ep in &mut self.episodes {
            if ep.traj.trained_turn.is_some() && ep.traj.turns.is_empty() && !ep.failed {
                let e = EpisodeError::Failed(ep.id, "no room for the branched turn".into());
                tracing::warn!(episode = ep.id, error = %e, "episode failed; excluded from the batch");
                self.last_failure = Some(e.to_string());
                ep.failed = true;
            }
        }
        // Truncated and failed episodes may still be live on their shards.
        let open: Vec<u64> = self
            .episodes
            .iter()
            .filter(|e| !e.env_ended)
            .map(|e| e.id)
            .collect();
        close_on_shards(self.shards, open);
        let mut stats = self.stats;
        for sampler in self.samplers.iter().flatten() {
            let (steps, busy, resubmitted) = sampler.counters();
            stats.decode_steps += steps;
            stats.busy_decode_steps += busy;
            stats.resubmitted_requests += resubmitted;
        }
        let mut extras = RolloutExtras {
            last_failure: self.last_failure,
            ..RolloutExtras::default()
        };
        if self.spec.reroll.is_some() {
            extras.passes = self
                .groups
                .values()
                .map(|g| g.attempts.len())
                .max()
                .unwrap_or(1);
            extras.uniform_groups = self
                .groups
                .iter()
                .filter(|(_, g)| g.chosen.is_none())
                .map(|(&id, _)| id)
                .collect();
        }
        let kept: HashMap<u64, usize> = self
            .groups
            .iter()
            .map(|(&id, g)| (id, g.chosen.unwrap_or(0)))
            .collect();
        // RB-4: later segments take ids past every episode's.
        let mut next_id = self.episodes.iter().map(|e| e.id + 1).max().unwrap_or(0);
        let mut order: Vec<usize> = (0..self.episodes.len()).collect();
        order.sort_by_key(|&i| (self.episodes[i].plan, self.episodes[i].attempt));
        let mut episodes: Vec<Option<Episode>> = self.episodes.into_iter().map(Some).collect();
        let mut trajectories = Vec::with_capacity(episodes.len());
        for i in order {
            let Some(mut ep) = episodes[i].take() else {
                continue;
            };
            if ep.failed {
                stats.failed_episodes += 1;
                continue;
            }
            stats.episodes += 1;
            stats.successes += usize::from(ep.success);
            stats.reward_sum += f64::from(ep.traj.final_reward);
            if kept.get(&ep.traj.group_id).copied().unwrap_or(0) != ep.attempt {
                continue;
            }
            let finished = ep
                .finished
                .map_or(0.0, |t| t.duration_since(self.started).as_secs_f64());
            let reward = ep.traj.final_reward;
            let mut segments = ep.segments;
            segments.push(ep.traj);
            let last = segments.len() - 1;
            for (k, mut t) in segments.into_iter().enumerate() {
                if k > 0 {
                    t.trajectory_id = next_id;
                    next_id += 1;
                }
                t.final_reward = reward;
                extras.task_types.push(ep.task_type.clone());
                extras.finished_seconds.push(finished);
                if self.spec.capture_boundaries {
                    // Boundaries are captured only by envs with snapshots, which never segment.
                    extras.boundaries.push(match k == last {
                        true => std::mem::take(&mut ep.boundaries),
                        false => Vec::new(),
                    });
                }
                trajectories.push(t);
            }
        }
        let batch = RolloutBatch {
            run_id: self.spec.run_id.clone(),
            batch_seq: self.spec.batch_seq,
            generator_id: self.spec.generator_id,
            policy_version: self.spec.policy_version,
            created_unix_ms: unix_ms(),
            trajectories,
        };
        (batch, stats, extras)
    }
}
