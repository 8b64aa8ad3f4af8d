//! The relay of a streamed answer: the response body the client reads is
//! the provider's own body, each frame passed on as it comes (no copy, no
//! task or channel between them) and read by the [`Meter`] on its way,
//! the provider's key scrubbed from it ([`StreamScrubber`]: a frame that
//! shows nothing of it and ends between words passes as it is).
//! When the stream ends, breaks off or stalls past the idle deadline, the
//! call is settled before the client sees the end (a fault then ends the
//! stream with an error event in the API's terms, and the call, its usage
//! not whole, is charged its worst case: the provider bills what it
//! generated, which nobody here saw). When the client hangs
//! up, the body is dropped, but the provider goes on generating, and
//! billing, what was asked: the rest of its stream is read in a task of its
//! own ([`drain`]), each piece within the idle deadline and all within
//! `drain_ms`, and the call is settled as cancelled with the final usage,
//! or, if that is not seen, with its worst case; never less.

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    task::{Context, Poll, ready},
    time::Duration,
};

use axum::{body::Bytes, http::StatusCode};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::{
    task::JoinHandle,
    time::{Instant, Sleep},
};

use super::{
    forward::Call,
    meter::Meter,
    scrub::StreamScrubber,
    settle::Settlement,
    shape::{Api, ApiError, Kind},
    usage::Reported,
};
use troupe_domain::model::CallOutcome;
use troupe_store::Store;

/// A streamed answer on its way to the client.
pub(super) struct Relay<S: Store> {
    /// Taken by [`drain`] when the client hangs up mid-stream.
    upstream: Option<Incoming>,
    meter: Meter,
    scrubber: StreamScrubber,
    state: State<S>,
    status: StatusCode,
    api: Api,
    idle: Duration,
    /// How long the stream is read on once the client hung up.
    drain: Duration,
    provider: String,
    /// When the provider will have been silent too long; set when the
    /// client asks for the next frame, so its own pace never counts.
    deadline: Instant,
    /// Whether `deadline` is set for the frame being waited for.
    waiting: bool,
    /// Wakes the body at the deadline (or earlier: it is moved on lazily,
    /// not at every frame).
    timer: Pin<Box<Sleep>>,
}

enum State<S: Store> {
    /// Frames are passing; the reservation is held.
    Streaming(Box<Settlement<S>>),
    /// The call is being settled (a task of its own, so that a client that
    /// hangs up meanwhile cannot cut it short); then the last frame, if any.
    Settling(JoinHandle<()>, Option<Bytes>),
    /// The error event that ends a stream that broke off.
    Tail(Bytes),
    Done,
}

impl<S: Store> Relay<S> {
    pub(super) fn new(
        upstream: Incoming,
        settlement: Settlement<S>,
        status: StatusCode,
        call: &Call,
    ) -> Relay<S> {
        let idle = call.timeouts.idle;
        let deadline = Instant::now() + idle;
        Relay {
            upstream: Some(upstream),
            meter: Meter::new(call.api),
            scrubber: StreamScrubber::new(call.scrubber.clone()),
            state: State::Streaming(Box::new(settlement)),
            status,
            api: call.api,
            idle,
            drain: call.timeouts.drain,
            provider: call.provider.name.clone(),
            deadline,
            waiting: false,
            timer: Box::pin(tokio::time::sleep_until(deadline)),
        }
    }

    /// Settles the call with what was reported and `outcome`; a `fault`
    /// is then told to the client as the stream's last event.
    fn finish(&mut self, outcome: CallOutcome, fault: Option<ApiError>) {
        let State::Streaming(mut settlement) = std::mem::replace(&mut self.state, State::Done)
        else {
            return;
        };
        if fault.is_some() && !self.meter.reported.final_usage {
            // Cut short before its usage was whole: what the provider
            // generated (and bills) is unknown, so it is charged in full.
            self.meter.reported.unreadable = true;
        }
        let reported = self.meter.reported.clone();
        let status = Some(self.status);
        let settling =
            tokio::spawn(async move { settlement.settle(&reported, outcome, status).await });
        // The end of a word held back, then the fault's event.
        let mut tail = self.scrubber.rest().to_vec();
        if let Some(fault) = fault {
            tail.extend_from_slice(fault.stream_event(self.api).as_bytes());
        }
        let tail = (!tail.is_empty()).then(|| Bytes::from(tail));
        self.state = State::Settling(settling, tail);
    }

    /// The stream's end, as the provider's events tell it.
    fn ended(&mut self) {
        if self.meter.reported.complete && !self.meter.reported.final_usage {
            // Whole, but without the usage that says what it cost.
            self.meter.reported.unreadable = true;
        }
        let reported = &self.meter.reported;
        if reported.complete || reported.error.is_some() {
            // A provider's error event is already relayed.
            let outcome = match reported.error {
                Some(_) => CallOutcome::Failed,
                None => CallOutcome::Ok,
            };
            self.finish(outcome, None);
        } else {
            let fault = ApiError::new(
                Kind::Upstream,
                format!(
                    "provider {}'s stream ended before the answer was whole",
                    self.provider
                ),
            );
            self.finish(CallOutcome::Failed, Some(fault));
        }
    }

    /// Polls the provider for its next frame, within the idle deadline.
    fn poll_upstream(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        if !self.waiting {
            self.deadline = Instant::now() + self.idle;
            self.waiting = true;
        }
        loop {
            let Some(upstream) = self.upstream.as_mut() else {
                return Poll::Ready(None);
            };
            match Pin::new(upstream).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    // Trailers are the connection's: not relayed.
                    if let Ok(data) = frame.into_data() {
                        self.meter.feed(&data);
                        let data = self.scrubber.pass(data);
                        if !data.is_empty() {
                            self.waiting = false;
                            return Poll::Ready(Some(data));
                        }
                        // All of it held back: the provider is not silent.
                        self.deadline = Instant::now() + self.idle;
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    let fault = ApiError::new(
                        Kind::Upstream,
                        format!("provider {}'s stream broke off: {e}", self.provider),
                    );
                    self.finish(CallOutcome::Failed, Some(fault));
                    return Poll::Ready(None);
                }
                Poll::Ready(None) => {
                    self.ended();
                    return Poll::Ready(None);
                }
                Poll::Pending => {
                    if self.timer.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    if Instant::now() >= self.deadline {
                        let fault = ApiError::new(
                            Kind::Timeout,
                            format!(
                                "provider {} stopped streaming for {} ms",
                                self.provider,
                                self.idle.as_millis()
                            ),
                        );
                        self.finish(CallOutcome::Failed, Some(fault));
                        return Poll::Ready(None);
                    }
                    // The timer was set for an earlier frame: move it on,
                    // and look again (which also registers it).
                    let deadline = self.deadline;
                    self.timer.as_mut().reset(deadline);
                }
            }
        }
    }
}

/// No field is pinned in place: the provider's body and the settlement's
/// task are `Unpin`, the timer is boxed, the store is only ever moved whole.
impl<S: Store> Unpin for Relay<S> {}

impl<S: Store> Body for Relay<S> {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        loop {
            match &mut this.state {
                State::Streaming(_) => {
                    if let Some(data) = ready!(this.poll_upstream(cx)) {
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                }
                State::Settling(settling, tail) => {
                    // A settlement task that died released its reservation
                    // (the settlement's drop): the stream ends all the same.
                    let _ = ready!(Pin::new(settling).poll(cx));
                    this.state = match tail.take() {
                        Some(tail) => State::Tail(tail),
                        None => State::Done,
                    };
                }
                State::Tail(tail) => {
                    let tail = std::mem::take(tail);
                    this.state = State::Done;
                    return Poll::Ready(Some(Ok(Frame::data(tail))));
                }
                State::Done => return Poll::Ready(None),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, State::Done)
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl<S: Store> Drop for Relay<S> {
    /// The client hung up before the stream ended: the rest of the stream
    /// is read for its final usage ([`drain`]), and the call settled as
    /// cancelled.
    fn drop(&mut self) {
        let State::Streaming(settlement) = std::mem::replace(&mut self.state, State::Done) else {
            return;
        };
        let (Some(upstream), Ok(handle)) =
            (self.upstream.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let meter = std::mem::replace(&mut self.meter, Meter::new(self.api));
        let bounds = (self.idle, self.drain);
        handle.spawn(drain(upstream, meter, settlement, self.status, bounds));
    }
}

/// Reads the rest of a stream whose client hung up, each piece within
/// `idle` and all within `bound`, then settles the call as cancelled: with
/// the final usage if the stream ended whole, else with its worst case.
async fn drain<S: Store>(
    mut upstream: Incoming,
    mut meter: Meter,
    mut settlement: Box<Settlement<S>>,
    status: StatusCode,
    (idle, bound): (Duration, Duration),
) {
    use http_body_util::BodyExt;
    let deadline = Instant::now() + bound;
    loop {
        let wait = idle.min(deadline.saturating_duration_since(Instant::now()));
        match tokio::time::timeout(wait, upstream.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    meter.feed(&data);
                }
            }
            // Its end, a break, or out of time.
            _ => break,
        }
    }
    let reported = meter.reported;
    let whole = reported.complete && reported.final_usage && reported.error.is_none();
    let reported = if whole {
        reported
    } else {
        Reported {
            unreadable: true,
            ..reported
        }
    };
    settlement
        .settle(&reported, CallOutcome::Cancelled, Some(status))
        .await;
}
