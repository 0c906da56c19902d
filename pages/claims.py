import streamlit as st

st.title("The papers' claims, measured")
