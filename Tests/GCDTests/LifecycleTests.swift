import Testing

@testable import GCD

/// The life-cycle state machine (Internals/Lifecycle.swift), without
/// libdispatch: every state × every event against a written table, then a
/// model of the C object's counters driven by every event sequence, which
/// must never over-resume and must always end releasable.
@Suite("Lifecycle")
struct LifecycleTests {
  typealias Action = Lifecycle.Action

  /// The states, by name (suspensions up to 2; a cancelled source's count
  /// is the user's unmatched `suspend()` calls).
  static let states: [(String, Lifecycle)] = [
    ("inactive", .inactive),
    ("inactive, suspended(1)", state(active: false, cancelled: false, suspensions: 1)),
    ("inactive, suspended(2)", state(active: false, cancelled: false, suspensions: 2)),
    ("active", .active),
    ("suspended(1)", state(active: true, cancelled: false, suspensions: 1)),
    ("suspended(2)", state(active: true, cancelled: false, suspensions: 2)),
    ("cancelled before start", state(active: false, cancelled: true, suspensions: 0)),
    ("cancelled before start, 1 unmatched suspend", state(active: false, cancelled: true, suspensions: 1)),
    ("cancelled after start", state(active: true, cancelled: true, suspensions: 0)),
    ("cancelled after start, 1 unmatched suspend", state(active: true, cancelled: true, suspensions: 1)),
  ]

  static func state(active: Bool, cancelled: Bool, suspensions: UInt) -> Lifecycle {
    Lifecycle(
      rawValue: (active ? Lifecycle.activeBit : 0) | (cancelled ? Lifecycle.cancelledBit : 0)
        | suspensions * Lifecycle.suspensionUnit)
  }

  enum Event: String, CaseIterable {
    case activate, suspend, resumeQueue, resumeSource, cancel, drop

    func apply(_ state: inout Lifecycle) -> Action {
      switch self {
      case .activate: state.activate()
      case .suspend: state.suspend()
      case .resumeQueue: state.resume(starts: false)
      case .resumeSource: state.resume(starts: true)
      case .cancel: state.cancel()
      case .drop: state.drop()
      }
    }
  }

  /// Expected (state after, action) for each state (rows, in `states`
  /// order) and event (columns, in `Event.allCases` order). "final" is the
  /// state after a drop: released.
  static let table: [[(String, Action)]] = [
    // inactive
    [
      ("active", .activate), ("inactive, suspended(1)", .none), ("inactive", .unbalanced(.notSuspended)),
      ("active", .activate), ("cancelled before start", .settle(resumes: 0, activate: true)),
      ("final", .settle(resumes: 0, activate: true)),
    ],
    // inactive, suspended(1)
    [
      ("suspended(1)", .activate), ("inactive, suspended(2)", .none), ("inactive", .resume), ("inactive", .resume),
      ("cancelled before start, 1 unmatched suspend", .settle(resumes: 1, activate: true)),
      ("final", .settle(resumes: 1, activate: true)),
    ],
    // inactive, suspended(2)
    [
      ("suspended(2)", .activate), ("inactive, suspended(3)", .none), ("inactive, suspended(1)", .resume),
      ("inactive, suspended(1)", .resume),
      ("cancelled before start, 2 unmatched suspends", .settle(resumes: 2, activate: true)),
      ("final", .settle(resumes: 2, activate: true)),
    ],
    // active
    [
      ("active", .none), ("suspended(1)", .none), ("active", .unbalanced(.notSuspended)),
      ("active", .unbalanced(.notSuspended)), ("cancelled after start", .settle(resumes: 0, activate: false)),
      ("final", .settle(resumes: 0, activate: false)),
    ],
    // suspended(1)
    [
      ("suspended(1)", .none), ("suspended(2)", .none), ("active", .resume), ("active", .resume),
      ("cancelled after start, 1 unmatched suspend", .settle(resumes: 1, activate: false)),
      ("final", .settle(resumes: 1, activate: false)),
    ],
    // suspended(2)
    [
      ("suspended(2)", .none), ("suspended(3)", .none), ("suspended(1)", .resume), ("suspended(1)", .resume),
      ("cancelled after start, 2 unmatched suspends", .settle(resumes: 2, activate: false)),
      ("final", .settle(resumes: 2, activate: false)),
    ],
    // cancelled before start
    [
      ("cancelled before start", .none), ("cancelled before start, 1 unmatched suspend", .resume),
      ("cancelled before start", .unbalanced(.cancelled)), ("cancelled after start", .none),
      ("cancelled before start", .none), ("cancelled before start", .none),
    ],
    // cancelled before start, 1 unmatched suspend
    [
      ("cancelled before start, 1 unmatched suspend", .none), ("cancelled before start, 2 unmatched suspends", .resume),
      ("cancelled before start", .none), ("cancelled before start", .none),
      ("cancelled before start, 1 unmatched suspend", .none), ("cancelled before start, 1 unmatched suspend", .none),
    ],
    // cancelled after start
    [
      ("cancelled after start", .none), ("cancelled after start, 1 unmatched suspend", .resume),
      ("cancelled after start", .unbalanced(.cancelled)), ("cancelled after start", .unbalanced(.cancelled)),
      ("cancelled after start", .none), ("cancelled after start", .none),
    ],
    // cancelled after start, 1 unmatched suspend
    [
      ("cancelled after start, 1 unmatched suspend", .none), ("cancelled after start, 2 unmatched suspends", .resume),
      ("cancelled after start", .none), ("cancelled after start", .none),
      ("cancelled after start, 1 unmatched suspend", .none), ("cancelled after start, 1 unmatched suspend", .none),
    ],
  ]

  /// A state's name as the table writes it.
  static func name(of state: Lifecycle) -> String {
    if state.isCancelled {
      let base = state.isActive ? "cancelled after start" : "cancelled before start"
      switch state.suspensions {
      case 0: return base
      case 1: return base + ", 1 unmatched suspend"
      default: return base + ", \(state.suspensions) unmatched suspends"
      }
    }
    let base = state.isActive ? "" : "inactive"
    if state.suspensions == 0 { return state.isActive ? "active" : base }
    return (state.isActive ? "" : base + ", ") + "suspended(\(state.suspensions))"
  }

  @Test("every state × every event moves to the state and asks for the action the table says")
  func everyStateAndEvent() {
    #expect(LifecycleTests.table.count == LifecycleTests.states.count)
    for (row, (stateName, state)) in LifecycleTests.states.enumerated() {
      #expect(LifecycleTests.name(of: state) == stateName)
      for (column, event) in Event.allCases.enumerated() {
        var next = state
        let action = event.apply(&next)
        let (expectedState, expectedAction) = LifecycleTests.table[row][column]
        #expect(action == expectedAction, "\(stateName) × \(event.rawValue)")
        let reached = event == .drop && !state.isCancelled ? "final" : LifecycleTests.name(of: next)
        #expect(reached == expectedState, "\(stateName) × \(event.rawValue)")
      }
    }
  }

  @Test("the retargeted bit is independent of the life cycle and survives every event but drop")
  func retargetedBit() {
    for (stateName, state) in LifecycleTests.states {
      var marked = state
      #expect(marked.retarget() == .none)
      #expect(marked.isRetargeted, "\(stateName)")
      for event in Event.allCases where event != .drop {
        var plain = state
        var retargeted = marked
        #expect(event.apply(&plain) == event.apply(&retargeted), "\(stateName) × \(event.rawValue)")
        #expect(retargeted.isRetargeted)
        #expect(retargeted.rawValue & ~Lifecycle.retargetedBit == plain.rawValue, "\(stateName) × \(event.rawValue)")
      }
    }
  }

  /// The event sequence's hold among the user's events, on a source the sequence started.
  enum HoldEvent: String, CaseIterable {
    case suspend, resume, hold, release, cancel
  }

  @Test(
    "a sequence's hold among every sequence of up to 7 of the user's suspend, resume and cancel: never an over-resume, a resume of the user's never ends it, cancel and drop balance it"
  )
  func holdAmongEverySequence() {
    var sequences: [[HoldEvent]] = [[]]
    for _ in 0..<7 { sequences = sequences.flatMap { prefix in HoldEvent.allCases.map { prefix + [$0] } } }
    for sequence in sequences {
      let label = "\(sequence.map(\.rawValue))"
      var state = Lifecycle.active
      var object = CObject(activated: true)
      var userSuspensions = 0
      for event in sequence {
        switch event {
        case .suspend:
          object.suspendCount += 1
          object.perform(state.suspend())
          userSuspensions += 1
        case .resume:
          let action = state.resume(starts: true)
          if userSuspensions > 0 {
            userSuspensions -= 1
          } else if !state.isCancelled && state.isHeld {
            #expect(action == .unbalanced(.held), "\(label)")
          }
          object.perform(action)
        case .hold:
          // The sequence holds once, until its consumer takes the element.
          guard !state.isHeld else { continue }
          object.suspendCount += 1
          object.perform(state.hold())
        case .release:
          guard state.isHeld else { continue }
          object.perform(state.release())
        case .cancel:
          object.perform(state.cancel())
        }
        #expect(!object.overResumed, "\(label)")
        #expect(state.isSuspended == (!state.isCancelled && (state.suspensions > 0 || state.isHeld)), "\(label)")
        if !state.isCancelled {
          // What the word says is in C: the user's suspensions and the hold.
          #expect(object.suspendCount == Int(state.suspensions) + (state.isHeld ? 1 : 0), "\(label)")
        } else {
          #expect(object.activated && object.suspendCount == 0, "\(label): a cancel left a suspension in C")
        }
      }
      object.perform(state.drop())
      #expect(object.activated && object.suspendCount == 0 && !object.overResumed, "\(label)")
    }
    #expect(sequences.count == 78_125)
  }

  /// The C object's side: activated or not, libdispatch's suspension count.
  struct CObject {
    var activated: Bool
    var suspendCount = 0
    var overResumed = false

    mutating func perform(_ action: Action) {
      switch action {
      case .none, .unbalanced: break
      case .activate: activated = true
      case .resume: resume()
      case .settle(let resumes, let activate):
        for _ in 0..<resumes { resume() }
        if activate { activated = true }
      }
    }

    mutating func resume() {
      suspendCount -= 1
      if suspendCount < 0 { overResumed = true }
    }
  }

  /// Applies `event` as the wrappers do: `suspend()` calls `dispatch_suspend` before the event.
  static func drive(_ event: Event, _ state: inout Lifecycle, _ object: inout CObject) -> Action {
    if event == .suspend { object.suspendCount += 1 }
    let action = event.apply(&state)
    object.perform(action)
    return action
  }

  @Test(
    "every sequence of up to 6 events never over-resumes the C object, and cancel or drop leaves it started and balanced",
    arguments: [true, false])
  func everySequence(startsActive: Bool) {
    // Sources start inactive and resume with `starts`; queues either way, without cancel.
    var sequences: [[Event]] = [[]]
    for _ in 0..<6 {
      sequences = sequences.flatMap { prefix in Event.allCases.filter { $0 != .drop }.map { prefix + [$0] } }
    }
    var checked = 0
    for sequence in sequences {
      var state: Lifecycle = startsActive ? .active : .inactive
      var object = CObject(activated: startsActive)
      for event in sequence { _ = LifecycleTests.drive(event, &state, &object) }
      #expect(!object.overResumed, "\(sequence.map(\.rawValue))")
      if state.isCancelled {
        // Cancel is final and prompt: nothing holds the cancel handler back.
        #expect(object.activated && object.suspendCount == 0, "\(sequence.map(\.rawValue))")
      }
      _ = LifecycleTests.drive(.drop, &state, &object)
      #expect(object.activated && object.suspendCount == 0 && !object.overResumed, "\(sequence.map(\.rawValue))")
      checked += 1
    }
    #expect(checked == 15_625)
  }
}
