import Testing

@testable import GCD

// The descriptor fence's per-descriptor state, model-checked (issue 38, item 3): two sources on one
// descriptor (a read and a write source, as a connection has, or two read sources), the kernel's
// one-shot registration, the fence's reader thread, each source's queue and the user's thread, over
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
// a handler reads or writes until `EAGAIN`, or leaves some).
//
// A lost event is a state in which no step but the user's and the peer's can run (the system is at
// rest) while a source that is started, not suspended, not cancelled and has its handler has its
// direction ready: no registration armed for it, no record queued, no merge pending, no handler
// running. The check proves none is reachable, and that the same check finds one when the fix of
// defect 1 is taken out (a handler set after the source's first event never re-arms it).

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
}

/// A state of the whole system. The watches' own flags (`armed`, `inTable`, the list's order,
/// `arming`) and the entry's counts are saved here by value; `handling` is the real value type, its
/// handler reduced to whether there is one in the state's `key`.
private struct ModelState {
  var entryPresent = false
  var armedReaders = 0
  var armedWriters = 0
  var kernelMask: UInt32 = 0
  var order: [Int] = []
  var armed = [false, false]
  var inTable = [false, false]
  var atStart = [false, false]
  var handling = [DescriptorWatch.Handling(), DescriptorWatch.Handling()]
  var sources = [SourceModel(), SourceModel()]
  // The kernel.
  var registeredInKernel = false
  var kernelArmed: UInt32 = 0
  var ready: UInt32 = 0
  /// A record in the instance's ready list (its events), 0 for none.
  var queued: UInt32 = 0
  /// A record the reader took from `epoll_wait` and has not handled, 0 for none.
  var fetched: UInt32 = 0
  /// The peer's readiness changes left.
  var arrivals = 2

  /// The state in one word (56 bits used), for the set of states seen: every field is a few bits.
  var key: UInt64 {
    var word: UInt64 = 0
    func put(_ value: Int, bits: Int) { word = word << UInt64(bits) | UInt64(value) }
    func put(_ flag: Bool) { put(flag ? 1 : 0, bits: 1) }
    func put(mask: UInt32) {
      put(mask & FenceModel.readable != 0)
      put(mask & FenceModel.writable != 0)
    }
    put(entryPresent)
    put(armedReaders, bits: 2)
    put(armedWriters, bits: 2)
    put(mask: kernelMask)
    put(arrivals, bits: 2)
    put(order.count, bits: 2)
    put(order.first ?? 0, bits: 1)
    for index in 0..<2 {
      put(armed[index])
      put(inTable[index])
      put(atStart[index])
      put(handling[index].handler != nil)
      put(handling[index].starved)
      put(handling[index].ended)
      let source = sources[index]
      for flag in [
        source.registered, source.started, source.suspendedOnce, source.suspended, source.handlerSetOnce,
        source.cancelRequested, source.cancelDone, source.mergePending, source.rearmPending,
      ] { put(flag) }
      put(source.phase == .idle ? 0 : source.phase == .handling ? 1 : 2, bits: 2)
    }
    put(registeredInKernel)
    put(mask: kernelArmed)
    put(mask: ready)
    put(mask: queued)
    put(mask: fetched)
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
      watch.next = nil
      watch.previous = nil
    }
    guard state.entryPresent else { return nil }
    var entry = DescriptorFence.Entry(generation: 1)
    for (position, index) in state.order.enumerated() {
      if position > 0 { watches[index].previous = watches[state.order[position - 1]] }
      if position + 1 < state.order.count { watches[index].next = watches[state.order[position + 1]] }
    }
    entry.first = state.order.first.map { watches[$0] }
    entry.armedReaders = state.armedReaders
    entry.armedWriters = state.armedWriters
    entry.kernelMask = state.kernelMask
    return entry
  }

  /// `state` with the watches' flags and the entry as they are now.
  func save(_ entry: DescriptorFence.Entry?, into state: inout ModelState) {
    for (index, watch) in watches.enumerated() {
      state.armed[index] = watch.armed
      state.inTable[index] = watch.inTable
      state.atStart[index] = watch.arming == .atStart
    }
    state.entryPresent = entry != nil
    state.order = []
    var next = entry?.first
    while let watch = next {
      state.order.append(watches.firstIndex { $0 === watch }!)
      next = watch.next
    }
    state.armedReaders = entry?.armedReaders ?? 0
    state.armedWriters = entry?.armedWriters ?? 0
    state.kernelMask = entry?.kernelMask ?? 0
  }

  // MARK: Steps

  /// A step: its name and what it does to a state (nil: not enabled there).
  struct Step {
    let name: String
    let isInternal: Bool
    let run: (ModelState) -> ModelState?
  }

  /// `EPOLL_CTL_MOD` with `mask` on the registration (the model's never fails): the fence records
  /// it as the kernel's mask.
  private func modify(_ mask: UInt32, _ entry: inout DescriptorFence.Entry?, _ state: inout ModelState) {
    state.kernelArmed = mask
    entry!.kernelMask = mask
  }

  /// `eventDone` and the re-arm after a handler is set: `DescriptorFence.rearm`.
  private func rearm(_ index: Int, _ entry: inout DescriptorFence.Entry?, _ state: inout ModelState) {
    if state.sources[index].cancelRequested { return }  // `source_testcancel`
    let watch = watches[index]
    guard watch.inTable, !watch.armed else { return }
    if let mask = entry!.rearm(watch) { modify(mask, &entry, &state) }
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

    // The kernel: an armed registration whose direction is ready queues a record, and disables
    // itself (one-shot).
    add("kernel reports", isInternal: true, when: { $0.queued == 0 && $0.kernelArmed & $0.ready != 0 }) { _, state in
      guard state.registeredInKernel, state.queued == 0, state.kernelArmed & state.ready != 0 else { return false }
      state.queued = state.kernelArmed & state.ready
      state.kernelArmed = 0
      return true
    }
    // The reader: takes the record out of `epoll_wait`, then handles it under the stripe's lock.
    add("reader waits", isInternal: true, when: { $0.queued != 0 && $0.fetched == 0 }) { _, state in
      guard state.queued != 0, state.fetched == 0 else { return false }
      (state.fetched, state.queued) = (state.queued, 0)
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
        state.sources[watches.firstIndex { $0 === watch }!].mergePending = true
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
      // The handler reads (or writes) until `EAGAIN`, or leaves some.
      for drains in [true, false] {
        add(
          "\(name) handler\(drains ? " drains" : " leaves some")", isInternal: true,
          when: { $0.sources[index].phase == .handling }
        ) { [unowned self] _, state in
          guard state.sources[index].phase == .handling else { return false }
          if drains { state.ready &= ~direction(index) }
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
        guard state.arrivals > 0, state.ready & bit == 0 else { return false }
        state.arrivals -= 1
        state.ready |= bit
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

  struct Outcome {
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

@Suite("DescriptorFence model")
struct DescriptorFenceModelTests {
  @Test(
    "no interleaving of two sources on one descriptor, the reader and the kernel loses an event",
    arguments: [("a read and a write source", [false, true]), ("two read sources", [false, false])])
  func noLostEvent(shape: String, writable: [Bool]) throws {
    let model = try FenceModel(writable: writable)
    let outcome = model.explore()
    print(
      "DescriptorFence model, \(shape): \(outcome.states) states, \(outcome.transitions) transitions, "
        + "\(outcome.statesAtRest) at rest; lost events: \(outcome.lost == nil ? "none" : "found")")
    #expect(outcome.lost == nil, "\(outcome.lost?.joined(separator: " → ") ?? "")")
    // Not vacuous: the space is the size the steps make (checked when the model changes).
    #expect(outcome.states > 10_000)
    #expect(outcome.statesAtRest > 1_000)
  }

  @Test("the same check finds the lost event of defect 1 when its fix is taken out")
  func findsDefect1() throws {
    let model = try FenceModel(writable: [false, true], withoutDefect1Fix: true)
    let outcome = model.explore(stopAtLost: true)
    let trace = try #require(outcome.lost)
    print("DescriptorFence model without defect 1's fix: \(trace.joined(separator: " → "))")
    #expect(trace.contains { $0.hasSuffix("handler set") })
  }
}
