"""A scripted generator's replies for a whole new domain ("library"), valid and not.

Keys are the pipeline's call keys (`orchestra_jax/synthesis/stages.py`). Each
stage gets at least one reply that must be rejected, and `EXPECTED` says, per
stage, what is kept and why the others are rejected.
"""

import json

DATA_MODEL = """
from typing import Dict, Literal

from pydantic import BaseModel

from tau2.environment.db import DB


class Book(BaseModel):
    book_id: str
    title: str
    author: str
    copies_available: int


class Member(BaseModel):
    member_id: str
    name: str
    email: str
    fees_due: float


class Loan(BaseModel):
    loan_id: str
    member_id: str
    book_id: str
    due_date: str
    status: Literal["active", "returned"]


class LibraryDB(DB):
    books: Dict[str, Book]
    members: Dict[str, Member]
    loans: Dict[str, Loan]
"""

TOOLS = '''
from tau2.domains.library.data_model import Book, LibraryDB, Loan, Member
from tau2.environment.toolkit import ToolKitBase, ToolType, is_tool


class LibraryTools(ToolKitBase):
    """The library's support tools."""

    db: LibraryDB

    def __init__(self, db: LibraryDB) -> None:
        super().__init__(db)

    @is_tool(ToolType.READ)
    def get_book_details(self, book_id: str) -> Book:
        """Get a book.

        Args:
            book_id: The book's id.

        Returns:
            The book.
        """
        if book_id not in self.db.books:
            raise ValueError(f"Book {book_id} not found")
        return self.db.books[book_id]

    @is_tool(ToolType.READ)
    def get_member_details(self, member_id: str) -> Member:
        """Get a member.

        Args:
            member_id: The member's id.

        Returns:
            The member.
        """
        if member_id not in self.db.members:
            raise ValueError(f"Member {member_id} not found")
        return self.db.members[member_id]

    @is_tool(ToolType.WRITE)
    def borrow_book(self, member_id: str, book_id: str, loan_id: str, due_date: str) -> Loan:
        """Lend a book to a member.

        Args:
            member_id: The member's id.
            book_id: The book's id.
            loan_id: The new loan's id.
            due_date: The return date, YYYY-MM-DD.

        Returns:
            The new loan.
        """
        book = self.get_book_details(book_id)
        self.get_member_details(member_id)
        if book.copies_available < 1:
            raise ValueError(f"No copy of {book_id} is available")
        if loan_id in self.db.loans:
            raise ValueError(f"Loan {loan_id} exists")
        book.copies_available -= 1
        loan = Loan(
            loan_id=loan_id, member_id=member_id, book_id=book_id, due_date=due_date,
            status="active",
        )
        self.db.loans[loan_id] = loan
        return loan

    @is_tool(ToolType.WRITE)
    def return_book(self, loan_id: str) -> Loan:
        """Return a borrowed book.

        Args:
            loan_id: The loan's id.

        Returns:
            The closed loan.
        """
        if loan_id not in self.db.loans or self.db.loans[loan_id].status != "active":
            raise ValueError(f"No active loan {loan_id}")
        loan = self.db.loans[loan_id]
        loan.status = "returned"
        self.db.books[loan.book_id].copies_available += 1
        return loan
'''

# The same kit, but one tool reads a table the data model lacks: its example raises.
RAISING_TOOLS = TOOLS.replace(
    "book = self.get_book_details(book_id)", "book = self.db.inventory[book_id]"
)

EXAMPLES = {
    "get_book_details": {"book_id": "B-1001"},
    "get_member_details": {"member_id": "M-01"},
    "borrow_book": {
        "member_id": "M-01",
        "book_id": "B-1002",
        "loan_id": "L-90",
        "due_date": "2025-07-01",
    },
    "return_book": {"loan_id": "L-01"},
}

SCHEMA = {
    "tables": {
        "books": {
            "description": "the catalogue",
            "id_field": "book_id",
            "fields": {
                "book_id": {"type": "str", "description": "id"},
                "title": {"type": "str", "description": "title"},
                "author": {"type": "str", "description": "author"},
                "copies_available": {"type": "int", "description": "copies on the shelf"},
            },
        },
        "members": {
            "description": "card holders",
            "id_field": "member_id",
            "fields": {
                "member_id": {"type": "str", "description": "id"},
                "name": {"type": "str", "description": "full name"},
                "email": {"type": "str", "description": "email"},
                "fees_due": {"type": "float", "description": "late fees owed, USD"},
            },
        },
        "loans": {
            "description": "books lent",
            "id_field": "loan_id",
            "fields": {
                "loan_id": {"type": "str", "description": "id"},
                "member_id": {"type": "members id", "description": "borrower"},
                "book_id": {"type": "books id", "description": "book"},
                "due_date": {"type": "str", "description": "YYYY-MM-DD"},
                "status": {"type": "str", "description": "active or returned"},
            },
        },
    }
}

BATCH_0 = {
    "books": {
        "B-1001": {
            "book_id": "B-1001",
            "title": "Middlemarch",
            "author": "George Eliot",
            "copies_available": 2,
        },
        "B-1002": {
            "book_id": "B-1002",
            "title": "Kindred",
            "author": "Octavia Butler",
            "copies_available": 1,
        },
    },
    "members": {
        "M-01": {
            "member_id": "M-01",
            "name": "Ada Obi",
            "email": "ada@example.org",
            "fees_due": 0.0,
        }
    },
    "loans": {
        "L-01": {
            "loan_id": "L-01",
            "member_id": "M-01",
            "book_id": "B-1001",
            "due_date": "2025-06-01",
            "status": "active",
        }
    },
}
# Valid alone, but B-1001 is already kept: dropped as a duplicate.
BATCH_1 = {
    "books": {
        "B-1001": {
            "book_id": "B-1001",
            "title": "Dune",
            "author": "Frank Herbert",
            "copies_available": 1,
        }
    },
    "members": {},
    "loans": {},
}
# A member without an email: the data model refuses it.
BATCH_2 = {
    "books": {},
    "members": {"M-02": {"member_id": "M-02", "name": "Bo Li", "fees_due": 1.5}},
    "loans": {},
}

POLICY = "# Library support policy\n\n" + " ".join(
    [
        "Identify the member by id before any change, confirm every loan or return with an "
        "explicit yes, never waive fees, and transfer to a human for anything else."
    ]
    * 5
)


def fenced(kind, body):
    return f"```{kind}\n{body}\n```"


def task(actions, changes, *, communicate=(), reason="I need help with a book."):
    return {
        "user_scenario": {
            "persona": "A patient reader.",
            "reason_for_call": reason,
            "known_info": "Member id M-01.",
            "unknown_info": "",
            "task_instructions": "Confirm when asked.",
        },
        "actions": [{"name": n, "arguments": a} for n, a in actions],
        "communicate_info": list(communicate),
        "nl_assertions": ["The request is handled."],
        "changes_database": changes,
    }


BORROW = (
    "borrow_book",
    {"member_id": "M-01", "book_id": "B-1002", "loan_id": "L-02", "due_date": "2025-07-01"},
)
READ = ("get_book_details", {"book_id": "B-1001"})
NO_COPY = (
    "borrow_book",
    {"member_id": "M-01", "book_id": "B-9999", "loan_id": "L-03", "due_date": "2025-07-01"},
)
RETURN = ("return_book", {"loan_id": "L-01"})

REPLIES = {
    "schema/0": '{"tables": {"books": {"description": "the catalogue",,}}',  # malformed JSON
    "schema/1": "Here is the schema.\n" + fenced("json", json.dumps(SCHEMA)),
    "data_model/0": fenced("python", DATA_MODEL),
    "entries/000": fenced("json", json.dumps(BATCH_0)),
    "entries/001": fenced("json", json.dumps(BATCH_1)),
    "entries/002": fenced("json", json.dumps(BATCH_2)),
    "tools/0": fenced("python", RAISING_TOOLS)
    + "\n"
    + fenced("json", json.dumps({"examples": EXAMPLES})),
    "tools/1": fenced("python", TOOLS) + "\n" + fenced("json", json.dumps({"examples": EXAMPLES})),
    "policy/0": "Be nice.",
    "policy/1": POLICY,
    "purposes/0": fenced("json", json.dumps({"purposes": ["borrow a book", "check a book"]})),
    "library-000-0": fenced("json", json.dumps(task([READ, BORROW], True))),
    "library-000-1": fenced("json", json.dumps(task([NO_COPY], True))),  # the book is unknown
    "library-001-0": fenced("json", json.dumps(task([READ], False, communicate=["Middlemarch"]))),
    "library-001-1": fenced("json", json.dumps({"user_scenario": {}, "actions": []})),
    "library-000-0-evolved": fenced("json", json.dumps(task([RETURN, BORROW], True))),
    "library-001-0-evolved": fenced("json", json.dumps(task([READ], True))),  # reads only
}

# stage -> (kept, {reason: rejected})
EXPECTED = {
    "schema": (1, {"invalid_json": 1}),
    "data_model": (1, {}),
    "entries": (1, {"duplicate_entry": 1, "entries_mismatch_data_model": 1}),
    "tools": (1, {"tool_raises": 1}),
    "policy": (1, {"policy_too_short": 1}),
    "purposes": (1, {}),
    "tasks": (2, {"gold_action_fails": 1, "schema_mismatch": 1}),
    "evolve": (1, {"db_change_mismatch": 1}),
}
KEPT_TASKS = ["library-000-0", "library-001-0", "library-000-0-evolved"]
