//! The relay of a streamed answer: the response body the client reads is
//! the provider's own body, each frame passed on as it comes (no copy, no
//! task or channel between them) and read by the [`Meter`] on its way.
//! When the stream ends, breaks off or stalls past the idle deadline, the
//! call is settled before the client sees the end (a fault then ends the
//! stream with an error event in the API's terms); when the client hangs
//! up, the body is dropped and the call is settled as cancelled with what
//! the provider had reported.

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
    forward::Settlement,
    shape::{Api, ApiError, Kind},
    usage::{Meter, Reported},
};
use crate::{model::CallOutcome, store::Store};

/// A streamed answer on its way to the client.
pub(super) struct Relay<S: Store> {
    upstream: Incoming,
    meter: Meter,
    state: State<S>,
    status: StatusCode,
    api: Api,
    idle: Duration,
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
        api: Api,
        idle: Duration,
        provider: String,
    ) -> Relay<S> {
        let deadline = Instant::now() + idle;
        Relay {
            upstream,
            meter: Meter::new(api),
            state: State::Streaming(Box::new(settlement)),
            status,
            api,
            idle,
            provider,
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
        let reported = self.meter.reported.clone();
        let status = Some(self.status);
        let settling =
            tokio::spawn(async move { settlement.settle(&reported, outcome, status).await });
        let tail = fault.map(|f| Bytes::from(f.stream_event(self.api)));
        self.state = State::Settling(settling, tail);
    }

    /// The stream's end, as the provider's events tell it.
    fn ended(&mut self) {
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
            match Pin::new(&mut self.upstream).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    // Trailers are the connection's: not relayed.
                    if let Ok(data) = frame.into_data() {
                        self.waiting = false;
                        self.meter.feed(&data);
                        return Poll::Ready(Some(data));
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
    /// The client hung up before the stream ended: the call is settled as
    /// cancelled, with what the provider had reported by then.
    fn drop(&mut self) {
        let State::Streaming(mut settlement) = std::mem::replace(&mut self.state, State::Done)
        else {
            return;
        };
        let reported: Reported = self.meter.reported.clone();
        let status = Some(self.status);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                settlement
                    .settle(&reported, CallOutcome::Cancelled, status)
                    .await;
            });
        }
    }
}
