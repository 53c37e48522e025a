import Testing

@testable import GCD

// The descriptor fence's per-descriptor state, model-checked (issue 38, item 3): two sources on one
// descriptor (a read and a write source, as a connection has, or two read sources), the kernel's
// edge-triggered registration, the fence's reader thread, each source's queue and the user's thread, over
// every interleaving of their steps. Each step that runs under the fence's stripe lock, or under a
// watch's handling lock, is one atomic transition, and runs the fence's own code on the fence's own
// values: `DescriptorFence.Entry`'s `insert`, `record`, `rearm`, `start`, `unregister`, and
// `DescriptorWatch.Handling`'s `event`, `set`, `end`, on real `DescriptorWatch` objects whose flags
// and links are saved into, and restored from, each explored state. What is modelled around them:
// the kernel (a registration's armed mask, the readiness of each direction, a record queued in the
// instance's ready list, one the reader has taken from `epoll_wait` and not yet handled), libdispatch
// (a merge pending in a source, delivered when the source is started, not suspended and idle; none
// after `cancel()`), and the user (register, set the handler, start, suspend, resume, cancel, each
// once per source, in any order) and the peer (the descriptor becomes readable or writable, twice;
// a handler reads or writes until `EAGAIN` and tells the source so (`ReadSource.read(into:)`), or
// does so on its own, or leaves some).
//
// A lost event is a state in which no step but the user's and the peer's can run (the system is at
// rest) while a source that is started, not suspended, not cancelled and has its handler has its
// direction ready: no registration armed for it, no record queued, no merge pending, no handler
// running. The check proves none is reachable, and that the same check finds one when the fix of
// defect 1 is taken out (a handler set after the source's first event never re-arms it).

/// Two values, one per source: a state's fields copy as plain values (no array to retain).
private struct Pair<Value> {
  var first: Value
  var second: Value
  init(_ value: Value) { (first, second) = (value, value) }
  subscript(index: Int) -> Value {
    get { index == 0 ? first : second }
    set { if index == 0 { first = newValue } else { second = newValue } }
  }
}

/// One source's part of a state.
private struct SourceModel: Hashable {
  enum Phase: Hashable {
    case idle
    /// Its event block took the handler and runs it.
    case handling
    /// The handler returned; the re-arm (`eventDone`) is next.
    case handled
  }
  var registered = false
  var started = false
  var suspendedOnce = false
  var suspended = false
  var handlerSetOnce = false
  var cancelRequested = false
  var cancelDone = false
  /// A merge into the C source that libdispatch has not delivered yet.
  var mergePending = false
  var phase = Phase.idle
  /// `setHandler` found the watch starved: its re-arm, outside the handling lock, is next.
  var rearmPending = false
  /// Its handler's reads emptied the descriptor since the last merge, and told the watch so.
  var drained = false
}

/// A state of the whole system. The watches' own flags (`armed`, `inTable`, the list's order,
/// `arming`) and the entry's counts are saved here by value; `handling` is the real value type, its
/// handler reduced to whether there is one in the state's `key`.
private struct ModelState {
  var entryPresent = false
  var armedReaders: UInt32 = 0
  var armedWriters: UInt32 = 0
  var kernelMask: UInt32 = 0
  /// The entry's registration is one-shot (`Entry.oneShot`; the kernel's is the same: each change
  /// comes with its modification, in one step).
  var oneShot = false
  /// The entry's list: how many watches, and the first one's index (the other follows it).
  var listed = 0
  var firstListed = 0
  var armed = Pair(false)
  var inTable = Pair(false)
  var atStart = Pair(false)
  var missed = Pair(false)
  var handling = Pair(DescriptorWatch.Handling())
  var sources = Pair(SourceModel())
  // The kernel.
  var registeredInKernel = false
  var kernelArmed: UInt32 = 0
  var ready: UInt32 = 0
  /// The registration is in the instance's ready list (an edge, or a modification that found it
  /// ready), 0 for not.
  var queued: UInt32 = 0
  /// A record the reader took from `epoll_wait` (the events ready then) and has not handled, 0
  /// for none.
  var fetched: UInt32 = 0
  /// The peer's readiness changes left.
  var arrivals = 2

  /// The state in one word (63 bits used), for the set of states seen: every field is a few bits.
  /// Straight-line shifts, one helper call per source: the test target is a debug build, where helper
  /// calls cost most of the exploration.
  var key: UInt64 {
    var word: UInt64 = 0
    word = word << 1 | (entryPresent ? 1 : 0)
    word = word << 1 | (oneShot ? 1 : 0)
    word = word << 2 | UInt64(armedReaders)
    word = word << 2 | UInt64(armedWriters)
    word = word << 1 | (kernelMask & FenceModel.readable != 0 ? 1 : 0)
    word = word << 1 | (kernelMask & FenceModel.writable != 0 ? 1 : 0)
    word = word << 2 | UInt64(arrivals)
    word = word << 2 | UInt64(listed)
    word = word << 1 | UInt64(firstListed)
    word = word << 19 | sourceKey(0)
    word = word << 19 | sourceKey(1)
    word = word << 1 | (registeredInKernel ? 1 : 0)
    word = word << 1 | (kernelArmed & FenceModel.readable != 0 ? 1 : 0)
    word = word << 1 | (kernelArmed & FenceModel.writable != 0 ? 1 : 0)
    word = word << 1 | (ready & FenceModel.readable != 0 ? 1 : 0)
    word = word << 1 | (ready & FenceModel.writable != 0 ? 1 : 0)
    word = word << 1 | (queued != 0 ? 1 : 0)
    word = word << 1 | (fetched & FenceModel.readable != 0 ? 1 : 0)
    word = word << 1 | (fetched & FenceModel.writable != 0 ? 1 : 0)
    return word
  }

  /// Source `index`'s 19 bits of `key`: its watch's flags, its handling and its model.
  private func sourceKey(_ index: Int) -> UInt64 {
    let source = self.sources[index]
    let handling = self.handling[index]
    var word: UInt64 = 0
    word = word << 1 | (armed[index] ? 1 : 0)
    word = word << 1 | (inTable[index] ? 1 : 0)
    word = word << 1 | (atStart[index] ? 1 : 0)
    word = word << 1 | (handling.handler != nil ? 1 : 0)
    word = word << 1 | (handling.starved ? 1 : 0)
    word = word << 1 | (handling.ended ? 1 : 0)
    word = word << 1 | (source.registered ? 1 : 0)
    word = word << 1 | (source.started ? 1 : 0)
    word = word << 1 | (source.suspendedOnce ? 1 : 0)
    word = word << 1 | (source.suspended ? 1 : 0)
    word = word << 1 | (source.handlerSetOnce ? 1 : 0)
    word = word << 1 | (source.cancelRequested ? 1 : 0)
    word = word << 1 | (source.cancelDone ? 1 : 0)
    word = word << 1 | (source.mergePending ? 1 : 0)
    word = word << 1 | (source.rearmPending ? 1 : 0)
    word = word << 2 | (source.phase == .idle ? 0 : source.phase == .handling ? 1 : 2)
    word = word << 1 | (source.drained ? 1 : 0)
    word = word << 1 | (missed[index] ? 1 : 0)
    return word
  }
}

/// The model: the real watches, and the transitions.
private final class FenceModel {
  static let readable = system_epollIn
  static let writable = system_epollOut

  let watches: [DescriptorWatch]
  /// The C sources the watches name (never started: the model merges nothing into them).
  private let sources: [DataOrSource]
  /// Take the fix of defect 1 out: an event that finds no handler is dropped with no trace, and
  /// setting the handler re-arms nothing (what libdispatch does with the package's old blocks).
  let withoutDefect1Fix: Bool

  init(writable: [Bool], withoutDefect1Fix: Bool = false) throws {
    let fence = try DescriptorFence.shared("DescriptorFenceModelTests")
    sources = writable.map { _ in DataOrSource(queue: Queue(label: "fence.model")) }
    watches = zip(sources, writable).map { source, writable in
      DescriptorWatch(raw: source.raw, queue: source.queue, fence: fence, descriptor: -1, writable: writable)
    }
    self.withoutDefect1Fix = withoutDefect1Fix
  }

  func direction(_ index: Int) -> UInt32 { watches[index].writable ? FenceModel.writable : FenceModel.readable }

  // MARK: Saving and restoring the real objects

  /// The watches' flags and links as `state` has them, and the entry.
  func load(_ state: ModelState) -> DescriptorFence.Entry? {
    for (index, watch) in watches.enumerated() {
      watch.armed = state.armed[index]
      watch.inTable = state.inTable[index]
      watch.arming = state.atStart[index] ? .atStart : .byRegistration
      watch.missed = state.missed[index]
      watch.next = nil
      watch.previous = nil
    }
    guard state.entryPresent else { return nil }
    var entry = DescriptorFence.Entry(generation: 1)
    if state.listed > 0 { entry.first = watches[state.firstListed] }
    if state.listed == 2 {
      let (first, second) = (watches[state.firstListed], watches[1 - state.firstListed])
      first.next = second
      second.previous = first
    }
    entry.armedReaders = state.armedReaders
    entry.armedWriters = state.armedWriters
    entry.kernelMask = state.kernelMask
    entry.oneShot = state.oneShot
    return entry
  }

  /// `state` with the watches' flags and the entry as they are now.
  func save(_ entry: DescriptorFence.Entry?, into state: inout ModelState) {
    for (index, watch) in watches.enumerated() {
      state.armed[index] = watch.armed
      state.inTable[index] = watch.inTable
      state.atStart[index] = watch.arming == .atStart
      state.missed[index] = watch.missed
    }
    state.entryPresent = entry != nil
    state.listed = 0
    state.firstListed = 0
    if let first = entry?.first {
      state.listed = first.next == nil ? 1 : 2
      state.firstListed = first === watches[0] ? 0 : 1
    }
    state.armedReaders = entry?.armedReaders ?? 0
    state.armedWriters = entry?.armedWriters ?? 0
    state.kernelMask = entry?.kernelMask ?? 0
    state.oneShot = entry?.oneShot ?? false
  }

  // MARK: Steps

  /// A step: its name and what it does to a state (nil: not enabled there).
  struct Step {
    let name: String
    let isInternal: Bool
    let run: (ModelState) -> ModelState?
  }

  /// `EPOLL_CTL_MOD` with `mask` on the registration (the model's never fails): the fence records
  /// it as the kernel's mask, and the kernel polls the file: a ready direction it asks for puts the
  /// registration in the ready list.
  private func modify(_ mask: UInt32, _ entry: inout DescriptorFence.Entry?, _ state: inout ModelState) {
    state.kernelArmed = mask
    entry!.kernelMask = mask
    if state.ready & mask != 0 { state.queued = 1 }
  }

  /// `eventDone` and the re-arm after a handler is set: `DescriptorFence.rearm`.
  private func rearm(_ index: Int, _ entry: inout DescriptorFence.Entry?, _ state: inout ModelState) {
    if state.sources[index].cancelRequested { return }  // `source_testcancel`
    let watch = watches[index]
    guard watch.inTable, !watch.armed else { return }
    if let mask = entry!.rearm(watch, drained: state.sources[index].drained) { modify(mask, &entry, &state) }
  }

  /// Runs `body` on the real objects restored from `state` when `enabled` says the step can run
  /// there (asked first: most steps cannot, and restoring costs more than asking); nil otherwise.
  private func step(
    _ state: ModelState, _ enabled: (ModelState) -> Bool,
    _ body: (inout DescriptorFence.Entry?, inout ModelState) -> Bool
  ) -> ModelState? {
    guard enabled(state) else { return nil }
    var next = state
    var entry = load(state)
    guard body(&entry, &next) else { return nil }
    save(entry, into: &next)
    return next
  }

  lazy var steps: [Step] = makeSteps()

  private func makeSteps() -> [Step] {
    var steps: [Step] = []
    func add(
      _ name: String, isInternal: Bool, when enabled: @escaping (ModelState) -> Bool = { _ in true },
      _ body: @escaping (inout DescriptorFence.Entry?, inout ModelState) -> Bool
    ) {
      steps.append(Step(name: name, isInternal: isInternal) { [unowned self] in step($0, enabled, body) })
    }

    // The kernel (edge-triggered): an edge puts the registration in the ready list (the peer's
    // steps, and `modify`); `epoll_wait` reports the events ready and asked for then, and takes it
    // out of the list (none ready: no record), and a one-shot registration that reports is off.
    add("reader waits", isInternal: true, when: { $0.queued != 0 && $0.fetched == 0 }) { _, state in
      guard state.queued != 0, state.fetched == 0 else { return false }
      (state.fetched, state.queued) = (state.ready & state.kernelArmed, 0)
      if state.fetched != 0 && state.oneShot { state.kernelArmed = 0 }
      return true
    }
    add("reader merges", isInternal: true, when: { $0.fetched != 0 }) { [unowned self] entry, state in
      guard state.fetched != 0 else { return false }
      let events = state.fetched
      state.fetched = 0
      // No entry: a record of a registration removed since (the generation check drops it too).
      guard entry != nil else { return true }
      let mask = entry!.record(
        readable: events & FenceModel.readable != 0, writable: events & FenceModel.writable != 0
      ) { watch in
        let index = watches.firstIndex { $0 === watch }!
        state.sources[index].mergePending = true
        state.sources[index].drained = false
      }
      if let mask { modify(mask, &entry, &state) }
      return true
    }

    for index in watches.indices {
      let name = "source \(index)"
      // libdispatch delivers a pending merge to a started, running, idle source: the watch's
      // event block (`fire`); none after `cancel()`.
      add("\(name) event block", isInternal: true, when: { $0.sources[index].mergePending }) {
        [unowned self] _, state in
        let source = state.sources[index]
        guard source.mergePending, source.started, !source.suspended, source.phase == .idle, !source.cancelDone
        else { return false }
        state.sources[index].mergePending = false
        if source.cancelRequested { return true }
        if withoutDefect1Fix {
          if state.handling[index].handler != nil { state.sources[index].phase = .handling }
        } else if state.handling[index].event() != nil {
          state.sources[index].phase = .handling
        }
        return true
      }
      // The handler reads (or writes) until `EAGAIN` and tells the watch (a read source's
      // `read(into:)`), or empties it on its own, or leaves some.
      for (variant, drains, tells) in [
        (" drains and tells", true, true), (" drains on its own", true, false), (" leaves some", false, false),
      ] where !tells || !watches[index].writable {
        add("\(name) handler\(variant)", isInternal: true, when: { $0.sources[index].phase == .handling }) {
          [unowned self] _, state in
          guard state.sources[index].phase == .handling else { return false }
          if drains { state.ready &= ~direction(index) }
          if tells { state.sources[index].drained = true }
          state.sources[index].phase = .handled
          return true
        }
      }
      add("\(name) eventDone", isInternal: true, when: { $0.sources[index].phase == .handled }) {
        [unowned self] entry, state in
        guard state.sources[index].phase == .handled else { return false }
        state.sources[index].phase = .idle
        rearm(index, &entry, &state)
        return true
      }
      add("\(name) re-arm after its handler is set", isInternal: true, when: { $0.sources[index].rearmPending }) {
        [unowned self] entry, state in
        guard state.sources[index].rearmPending else { return false }
        state.sources[index].rearmPending = false
        rearm(index, &entry, &state)
        return true
      }
      // The cancel block, once no handler runs: `unregister` (the last watch takes the
      // registration with it: `EPOLL_CTL_DEL`, which also empties the ready list), the handler let
      // go.
      add(
        "\(name) cancel block", isInternal: true,
        when: { $0.sources[index].cancelRequested && !$0.sources[index].cancelDone }
      ) { [unowned self] entry, state in
        let source = state.sources[index]
        guard source.cancelRequested, !source.cancelDone, source.started, source.phase == .idle else { return false }
        state.sources[index].cancelDone = true
        state.sources[index].mergePending = false
        let watch = watches[index]
        if watch.inTable, entry!.unregister(watch) {
          entry = nil
          (state.registeredInKernel, state.kernelArmed, state.queued) = (false, 0, 0)
        }
        _ = state.handling[index].end()
        return true
      }

      // The user's thread.
      add("\(name) register", isInternal: false, when: { !$0.sources[index].registered }) {
        [unowned self] entry, state in
        guard !state.sources[index].registered else { return false }
        state.sources[index].registered = true
        let watch = watches[index]
        if entry != nil {
          entry!.insert(watch, armed: false)
          watch.arming = .atStart
        } else {
          // `add`: a new registration of this watch alone, armed (`EPOLL_CTL_ADD`).
          var made = DescriptorFence.Entry(generation: 1)
          made.insert(watch)
          watch.arming = .byRegistration
          (state.registeredInKernel, state.kernelArmed) = (true, made.mask)
          if state.ready & made.mask != 0 { state.queued = 1 }
          made.kernelMask = made.mask
          entry = made
        }
        return true
      }
      add("\(name) handler set", isInternal: false, when: { !$0.sources[index].handlerSetOnce }) {
        [unowned self] _, state in
        guard state.sources[index].registered, !state.sources[index].handlerSetOnce else { return false }
        state.sources[index].handlerSetOnce = true
        if withoutDefect1Fix {
          state.handling[index].handler = .sequence
        } else if state.handling[index].set(.sequence) {
          state.sources[index].rearmPending = true
        }
        return true
      }
      add("\(name) resume (first start)", isInternal: false, when: { !$0.sources[index].started }) {
        [unowned self] entry, state in
        let source = state.sources[index]
        guard source.registered, !source.started, !source.cancelRequested else { return false }
        state.sources[index].started = true
        // The start hook: a watch that joined disarmed arms (`DescriptorFence.start`).
        let watch = watches[index]
        if watch.arming == .atStart, watch.inTable, !watch.armed {
          modify(entry!.start(watch), &entry, &state)
        }
        return true
      }
      add("\(name) suspend", isInternal: false, when: { !$0.sources[index].suspendedOnce }) { _, state in
        let source = state.sources[index]
        guard source.started, !source.suspendedOnce, !source.cancelRequested else { return false }
        state.sources[index].suspendedOnce = true
        state.sources[index].suspended = true
        return true
      }
      add("\(name) resume", isInternal: false, when: { $0.sources[index].suspended }) { _, state in
        guard state.sources[index].suspended else { return false }
        state.sources[index].suspended = false
        return true
      }
      // `cancel()` balances the suspensions and starts a source never started (without its start
      // hook), so that its cancel block runs.
      add("\(name) cancel", isInternal: false, when: { !$0.sources[index].cancelRequested }) { _, state in
        guard state.sources[index].registered, !state.sources[index].cancelRequested else { return false }
        state.sources[index].cancelRequested = true
        state.sources[index].suspended = false
        state.sources[index].started = true
        return true
      }
    }

    // The peer.
    for (name, bit) in [("readable", FenceModel.readable), ("writable", FenceModel.writable)] {
      add("peer makes the descriptor \(name)", isInternal: false, when: { $0.arrivals > 0 }) { _, state in
        // More data, or more room: an edge even when the direction was ready already.
        guard state.arrivals > 0 else { return false }
        state.arrivals -= 1
        state.ready |= bit
        if state.registeredInKernel, state.kernelArmed & bit != 0 { state.queued = 1 }
        return true
      }
    }
    return steps
  }

  /// A source whose event is lost in `state` (at rest), or nil.
  func lostEvent(in state: ModelState) -> Int? {
    watches.indices.first { index in
      let source = state.sources[index]
      return source.registered && source.started && !source.suspended && !source.cancelRequested
        && state.handling[index].handler != nil && state.ready & direction(index) != 0
    }
  }

  struct Outcome: Sendable {
    var states = 0
    var transitions = 0
    var statesAtRest = 0
    /// The steps from the start to the first lost event found.
    var lost: [String]?
  }

  /// Every state reachable from the start, breadth first; with `stopAtLost`, until the first lost
  /// event.
  func explore(stopAtLost: Bool = false) -> Outcome {
    var outcome = Outcome()
    let start = ModelState()
    // Each state seen, by key: the state it was first reached from, and the step.
    var seen: [UInt64: (parent: UInt64?, step: Int)] = [start.key: (nil, -1)]
    var frontier = [start]
    while !frontier.isEmpty {
      var nextFrontier: [ModelState] = []
      for state in frontier {
        outcome.states += 1
        let key = state.key
        var atRest = true
        for (index, step) in steps.enumerated() {
          guard let next = step.run(state) else { continue }
          outcome.transitions += 1
          if step.isInternal { atRest = false }
          let nextKey = next.key
          if seen[nextKey] == nil {
            seen[nextKey] = (key, index)
            nextFrontier.append(next)
          }
        }
        guard atRest else { continue }
        outcome.statesAtRest += 1
        if outcome.lost == nil, let index = lostEvent(in: state) {
          var trace: [String] = ["source \(index)'s event is lost"]
          var at = key
          while let (parent, step) = seen[at], let parent {
            trace.append(steps[step].name)
            at = parent
          }
          outcome.lost = trace.reversed()
          if stopAtLost { return outcome }
        }
      }
      frontier = nextFrontier
    }
    return outcome
  }
}

/// Serialized: one exploration at a time, each on a thread of its own (`onThreadOfItsOwn`).
@Suite("DescriptorFence model", .serialized)
struct DescriptorFenceModelTests {
  /// The exploration (tens of seconds of work in a debug build, minutes under a sanitizer) on a
  /// thread of its own: on a queue it held one of libdispatch's two pool threads on this machine
  /// for up to 117 s, and the other tests' handlers, which need those threads, hit their time
  /// limits (`GCD_STALL_REPORT=5s` named `fence.model.explore`).
  private func explore(_ model: FenceModel, stopAtLost: Bool = false) async -> FenceModel.Outcome {
    nonisolated(unsafe) let model = model
    return await onThreadOfItsOwn { model.explore(stopAtLost: stopAtLost) }
  }

  @Test(
    "no interleaving of two sources on one descriptor, the reader and the kernel loses an event",
    arguments: [("a read and a write source", [false, true]), ("two read sources", [false, false])])
  func noLostEvent(shape: String, writable: [Bool]) async throws {
    let model = try FenceModel(writable: writable)
    let outcome = await explore(model)
    print(
      "DescriptorFence model, \(shape): \(outcome.states) states, \(outcome.transitions) transitions, "
        + "\(outcome.statesAtRest) at rest; lost events: \(outcome.lost == nil ? "none" : "found")")
    #expect(outcome.lost == nil, "\(outcome.lost?.joined(separator: " → ") ?? "")")
    // Not vacuous: the space is the size the steps make (checked when the model changes).
    #expect(outcome.states > 10_000)
    #expect(outcome.statesAtRest > 1_000)
  }

  @Test("the same check finds the lost event of defect 1 when its fix is taken out")
  func findsDefect1() async throws {
    let model = try FenceModel(writable: [false, true], withoutDefect1Fix: true)
    let outcome = await explore(model, stopAtLost: true)
    let trace = try #require(outcome.lost)
    print("DescriptorFence model without defect 1's fix: \(trace.joined(separator: " → "))")
    #expect(trace.contains { $0.hasSuffix("handler set") })
  }
}
